"""The ``cpu-int8-openvino`` profile: OpenVINO's own INT8 (NNCF post-training quantization), built
at the first start for a model and held to the quality gate.

OpenVINO runs NNCF's INT8 graph at 1.73x the images per CPU-second of ``cpu-int8`` (ONNX
Runtime's dynamic INT8) on the development Xeon (bench/results/openvino/nncf). The build
(triton/python/int8_openvino_build.py, in the Triton env's interpreter, where ``nncf`` is pinned)
quantizes each tower's FP32 graph, calibrated on the calibration generator's photos and captions
(clip_gateway/model/calibration.py) through the model's own preprocessing, with another seed than
the gate's set; it keeps the OpenVINO IR beside the export with the gate's figures (INT8 vs FP32
on the gate's set, ``int8-openvino.json``) for the runtimes' versions and the precision of the
operations left unquantized (BF16 where the CPU has BF16 units, else FP32). Every start holds the
figures to its own thresholds (the INT8 gate's, clip_gateway/model/gate.py; profiles/gates.py).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from clip_gateway.model import gate
from clip_gateway.profiles import bf16

log = logging.getLogger(__name__)

RECORD = "int8-openvino.json"
#: The IR files per tower, beside the export (each with its ``.bin``).
FILES = {"image": "model_int8_openvino.xml", "text": "text_int8_openvino.xml"}
#: The set NNCF calibrates on: as many items as the gate's set, another seed (the gate then
#: measures on photos and captions the quantizer never saw).
PHOTOS, TEXTS, SEED = bf16.PHOTOS, bf16.TEXTS, 1
#: Python distributions in the Triton env whose versions decide the IR and its figures.
RUNTIMES = ("openvino", "nncf")
BUILD_SECONDS = 1200.0


class Int8OpenvinoUnavailable(RuntimeError):
    """The profile could not be built or measured here; the message says why."""


def rest_precision(flags: frozenset[str]) -> str:
    """OpenVINO's inference precision for the operations NNCF leaves unquantized: BF16 where the
    CPU has BF16 units (the study's fastest row within the gate), else FP32."""
    return "bf16" if bf16.bf16_flag(flags) else "f32"


def versions(python: Path) -> dict[str, str]:
    """OpenVINO's and NNCF's versions in the Triton env (from their metadata, not imported)."""
    script = "import importlib.metadata as m\n" + "".join(
        f"print(m.version({name!r}))\n" for name in RUNTIMES
    )
    try:
        done = subprocess.run([str(python), "-c", script], capture_output=True, text=True,
                              timeout=60)  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        raise Int8OpenvinoUnavailable(f"the Triton env's interpreter cannot run ({exc})") from exc
    if done.returncode != 0:
        raise Int8OpenvinoUnavailable(
            f"OpenVINO or NNCF is not installed in the Triton env ({python}): `make triton-env` "
            "installs them (requirements/triton-env.txt)"
        )
    return dict(zip(RUNTIMES, done.stdout.split(), strict=True))


def kept(export_dir: Path) -> dict[str, Any] | None:
    """The record beside the export, if its IR files are there too."""
    try:
        record: dict[str, Any] = json.loads((export_dir / RECORD).read_text())
    except (OSError, ValueError):
        return None
    towers = record.get("figures") or {}
    if not towers or not all((export_dir / FILES[t]).exists() for t in towers):
        return None
    return record


def build(
    export_dir: Path,
    python: Path,
    script: Path,
    threads: int,
    rest: str,
    *,
    timeout: float = BUILD_SECONDS,
    stop: Callable[[], bool] = lambda: False,
) -> dict[str, Any]:
    """Quantize each tower with NNCF into OpenVINO IR beside the export; per tower, INT8 vs FP32
    cosine on the gate's set."""
    manifest = json.loads((export_dir / "manifest.json").read_text())
    if not os.access(export_dir, os.W_OK):
        raise Int8OpenvinoUnavailable(f"the export directory {export_dir} is read-only: the "
                                      "OpenVINO INT8 files are built beside it")  # fmt: skip
    calibrating = bf16.calibration_inputs(manifest, export_dir, PHOTOS, TEXTS, SEED)
    checking = bf16.calibration_inputs(manifest, export_dir)
    with tempfile.TemporaryDirectory(prefix="clip-gateway-int8-openvino-") as scratch:
        names = ("calibration.npz", "gate.npz", "out.npz", "err.txt")
        feed, check, out, err = (Path(scratch) / name for name in names)
        np.savez(feed, **calibrating)  # type: ignore[arg-type]
        np.savez(check, **checking)  # type: ignore[arg-type]
        command = [str(python), str(script), str(export_dir), str(feed), str(check), str(out),
                   str(threads), rest]  # fmt: skip
        bf16.run_check(command, err, timeout, stop, "the OpenVINO INT8 build",
                       Int8OpenvinoUnavailable)  # fmt: skip
        embeddings = dict(np.load(out))
    sets = {
        "image": f"{bf16.PHOTOS} generated photos (clip_gateway/model/calibration.py, seed "
        f"{bf16.SEED}), resized and centre-cropped; NNCF calibrated on {PHOTOS} others "
        f"(seed {SEED})",
        "text": f"{bf16.TEXTS} generated captions (seed {bf16.SEED}); NNCF calibrated on "
        f"{TEXTS} others (seed {SEED})",
    }
    found = {}
    for tower in checking:
        cosine = gate.cosine(embeddings[f"int8_{tower}"], embeddings[f"fp32_{tower}"])
        found[tower] = {"set": sets[tower], "vs_fp32": gate.stats(cosine)}
    return found


def figures(
    export_dir: Path,
    python: Path,
    script: Path,
    threads: int,
    rest: str,
    *,
    timeout: float = BUILD_SECONDS,
    stop: Callable[[], bool] = lambda: False,
) -> dict[str, Any]:
    """The record beside the export, if it was built by these runtimes at ``rest``; else built
    now and recorded."""
    found = versions(python)
    record = kept(export_dir)
    if record is not None and record.get("runtimes") == found and record.get("rest") == rest:
        return record
    log.info("building OpenVINO INT8 (NNCF %s) for %s", found["nncf"], export_dir)
    measured = build(export_dir, python, script, threads, rest, timeout=timeout, stop=stop)
    record = {"runtimes": found, "rest": rest, "files": FILES, "figures": measured}
    (export_dir / RECORD).write_text(json.dumps(record, indent=1))
    return record


def quantization(
    record: dict[str, Any], tower: str, thresholds: dict[str, float] | None
) -> dict[str, Any]:
    """What /v1/models shows for a tower served by this profile."""
    figures = (record.get("figures") or {}).get(tower) or {}
    return {
        "precision": "int8",
        "runtime": "openvino",
        "method": "nncf post-training, smooth quant alpha 0.3",
        "rest": record.get("rest"),
        **(record.get("runtimes") or {}),
        "calibration_set": figures.get("set"),
        "cosine_vs_fp32": figures.get("vs_fp32"),
        "gate": thresholds,
    }
