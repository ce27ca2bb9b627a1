"""``python -m bench plans``: core plans for the CPU profiles, measured through the container
entrypoint: how ORT's threads (and their spin-waiting), Triton's instances and the gateway's
decode threads share this machine's cores (clip_gateway/config/plan.py chose from these figures).

Every plan is a set of settings the operator could give; the first is what the launcher did
before the core plan existed (ORT's own thread count with spinning, one decode thread per CPU),
the last what the core plan now chooses on 2 CPUs (``clip_gateway/config/plan.py``). Every plan
names its instance count: the core plan's default changed from 1 to 2 after this run.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.harness.machine import cpu_load as machine
from bench.harness.output import write_results
from bench.harness.systems import FULL, Limits, system

PLANS: dict[str, dict[str, str]] = {
    "before: ORT default threads, spinning, decode 1/CPU": {
        "GATEWAY_TRITON_INSTANCE_COUNT": "1", "GATEWAY_TRITON_CPU_THREADS": "0",
        "GATEWAY_TRITON_CPU_SPINNING": "true", "GATEWAY_DECODE_THREADS": "0",
    },
    "ORT all CPUs, no spinning, decode 1/CPU": {
        "GATEWAY_TRITON_INSTANCE_COUNT": "1", "GATEWAY_TRITON_CPU_SPINNING": "false",
        "GATEWAY_DECODE_THREADS": "0",
    },
    "ORT all CPUs, no spinning, decode 1": {
        "GATEWAY_TRITON_INSTANCE_COUNT": "1", "GATEWAY_TRITON_CPU_SPINNING": "false",
        "GATEWAY_DECODE_THREADS": "1",
    },
    "ORT all CPUs, spinning, decode 1": {
        "GATEWAY_TRITON_INSTANCE_COUNT": "1", "GATEWAY_TRITON_CPU_SPINNING": "true",
        "GATEWAY_DECODE_THREADS": "1",
    },
    "2 instances x 1 ORT thread, no spinning, decode 1": {
        "GATEWAY_TRITON_INSTANCE_COUNT": "2", "GATEWAY_TRITON_CPU_THREADS": "1",
        "GATEWAY_TRITON_CPU_SPINNING": "false", "GATEWAY_DECODE_THREADS": "1",
    },
}  # fmt: skip
#: The OpenVINO profiles' plans: its own threads (INFERENCE_NUM_THREADS, triton/python/model.py)
#: per instance; ORT's spin-waiting does not apply.
OPENVINO_PLANS: dict[str, dict[str, str]] = {
    "1 instance x all CPUs, decode 1": {
        "GATEWAY_TRITON_INSTANCE_COUNT": "1", "GATEWAY_TRITON_CPU_THREADS": "0",
        "GATEWAY_DECODE_THREADS": "1",
    },
    "2 instances x 1 thread, decode 1": {
        "GATEWAY_TRITON_INSTANCE_COUNT": "2", "GATEWAY_TRITON_CPU_THREADS": "1",
        "GATEWAY_DECODE_THREADS": "1",
    },
}  # fmt: skip
#: Which plans each profile is measured in (ONNX Runtime's by default).
PLANS_OF = {"cpu-bf16": OPENVINO_PLANS, "cpu-int8-openvino": OPENVINO_PLANS}
CELLS = ((32, 4), (32, 1), (8, 4), (1, 1), (1, 4))
LIMITS = replace(FULL, seconds=15.0, requests=200)


def run(
    out: Path, limits: Limits = LIMITS, profiles: tuple[str, ...] = ("cpu-int8",)
) -> dict[str, Any]:
    from clip_gateway.export.build import ensure_exported
    from clip_gateway.model.spec import Weights

    exported = ensure_exported("ViT-B-32", Weights.random(0), int8=True)
    results: dict[str, Any] = {"machine": machine(), "command": "python -m bench plans",
                               "cells": [list(c) for c in CELLS], "plans": {}}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-plans-") as tmp:
        for profile in profiles:
            for name, env in PLANS_OF.get(profile, PLANS).items():
                key = f"{profile}: {name}"
                results["plans"][key] = system(f"gateway-{profile}", exported.directory,
                                               Path(tmp), limits, env, CELLS)  # fmt: skip
                print(json.dumps({"plan": key}), flush=True)
    results["machine"]["load_avg_after"] = list(os.getloadavg())
    write_results(out, "plans", results, markdown=markdown(results))
    return results


def markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    cells = [f"b{b}xc{c}" for b, c in results["cells"]]
    lines = [
        "# Core plans on the CPU profiles",
        "",
        f"{m['cpu_model']}, nproc {m['nproc']}. `{results['command']}`; each plan started through "
        "the container entrypoint; cells bBATCH x cCLIENTS, compact JPEGs, img/s then p50 ms.",
        "",
        "| plan | load before | " + " | ".join(cells) + " |",
        "| --- | --- | " + " | ".join("---" for _ in cells) + " |",
    ]
    for name, found in results["plans"].items():
        row = [name, str(found["before"]["load_1m"])]
        for cell in cells:
            c = found["cells"][cell]
            row.append(
                f"{c['images_per_s']:.1f} img/s, {c.get('latency_ms', {}).get('p50', 0):.0f} ms"
            )
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"
