"""``python -m bench peers``: Infinity (``infinity-emb``, its torch CPU engine) beside the gateway's
default (``auto``, which says what it chose) and each fixed CPU profile, back to back in one run
on loopback, with the machine's GEMM ceilings and the model alone measured in the same run
(bench/harness/ceilings.py).

Every system gets the same compact JPEGs (bench/harness/photos.py, ~16-24 KB each) in batches of
1, 8 and 32 from 1 and 4 concurrent clients (``CELLS``), each cell bounded by a request count and
a duration. Infinity serves a Hugging Face CLIP checkpoint at ViT-B/32's sizes with random
weights made locally (bench/harness/peer_checkpoint.py) from its own virtualenv (``.peer-env``,
docs/BENCHMARKS.md "Beside Infinity on the CPU"); the gateway starts through the container
entrypoint, as deployed. Timings run from JPEG bytes in hand to embeddings in hand (Infinity:
base64 data URIs in JSON, base64 floats back; the gateway: multipart, binary floats back).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from bench.harness import ceilings, study
from bench.harness.machine import cpu_load as machine
from bench.harness.machine import wait_quiet
from bench.harness.systems import CELLS, FULL, SMOKE, Limits, cell_name, system

SYSTEMS = ("infinity", "gateway-auto", "gateway-cpu", "gateway-cpu-int8", "gateway-cpu-bf16",
           "gateway-cpu-int8-openvino")  # fmt: skip


def run(
    out: Path,
    limits: Limits,
    systems: tuple[str, ...] = SYSTEMS,
    cells: tuple[tuple[int, int], ...] = CELLS,
) -> dict[str, Any]:
    from bench.harness.models import export
    from bench.studies.peers_report import write

    exported = export(int8=True)
    manifest = json.loads((exported / "manifest.json").read_text())
    results: dict[str, Any] = {
        "machine": machine(),
        "limits": asdict(limits),
        "command": " ".join(["python -m bench", *sys.argv[1:]]),
        "export": manifest.get("int8", {}).get("figures"),
    }
    results["ceilings_before"] = wait_quiet(limits.quiet_wait_s)
    results["ceilings"] = ceilings.gemm_ceilings(reps=1 if limits is SMOKE else 5)
    reps = 1 if limits is SMOKE else 5
    results["model_alone"] = {
        precision: ceilings.model_alone(exported / file, "pixels", 224, reps=reps)
        for precision, file in (("fp32", "model.onnx"), ("int8", "model_int8.onnx"))
    }
    results["gop_per_image"] = round(ceilings.VIT_B32_GOP, 3)
    results["systems"] = {}
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp:
        for name in systems:
            results["systems"][name] = system(name, exported, Path(tmp), limits,
                                              cells=cells)  # fmt: skip
    results["machine"]["load_avg_after"] = list(os.getloadavg())
    write(results, out)
    return results


def main(argv: list[str]) -> int:
    parser = study.parser("peers", __doc__, smoke="one request per cell, for a check")
    parser.add_argument("--systems", nargs="+", default=None, help="default: all (SYSTEMS)")
    parser.add_argument("--cells", nargs="+", default=None, metavar="bBxcC",
                        help="only these cells, e.g. b1xc1 b32xc4 (default: all six)")  # fmt: skip
    parser.add_argument("--quiet-wait", type=float, default=None, metavar="S",
                        help="wait at most S s for a quiet machine before each system "
                        "(default 600); gateway-PROFILE@IxT: a fixed plan")  # fmt: skip
    args = parser.parse_args(argv)
    limits = SMOKE if args.smoke else FULL
    if args.quiet_wait is not None:
        limits = replace(limits, quiet_wait_s=args.quiet_wait)
    out = study.out(args, "peers")
    cells = tuple(c for c in CELLS if args.cells is None or cell_name(*c) in args.cells)
    run(out, limits, tuple(args.systems or SYSTEMS), cells)
    print(out, flush=True)
    return 0
