"""The CPU profiles' model plans as triton/python/model.py runs them: ``cpu-bf16`` (OpenVINO,
BF16 inference precision, FP32 graph) beside ``cpu-int8`` (ONNX Runtime, dynamic INT8 graph) and
``cpu`` (ONNX Runtime FP32), each as 1 instance x 2 threads and as 2 instances x 1 thread
(clip_gateway/profiles/plans.py ``CPU_MODEL_INSTANCES``), on the image tower at batch 32.

``python -m bench cpu-instances MODEL.onnx INT8.onnx PIXELS.npy OUT_DIR [SECONDS]`` in the Triton
env (``.triton-env``: numpy, onnxruntime, openvino). PIXELS.npy: uint8 [n, 224, 224, 3], n >= 32
(docs/PERFORMANCE.md: the calibration photos' crops, clip_gateway/profiles/bf16.py). Each instance
is a Python thread with its own session or compiled model, as Triton runs one stub process per
instance; every instance runs batch after batch for SECONDS. Figures: images per CPU-second of this
process (robust on a shared machine: CPU time spent, not wall time waited) and images/s (wall clock,
meaningful only on an idle machine). The systems and plans alternate round by round so background
load hits them alike.
"""

from __future__ import annotations

import json
import os
import platform
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

Runner = Callable[[np.ndarray], np.ndarray]
PLANS = ((1, 2), (2, 1))  # (instances, threads per instance) on 2 CPUs
BATCH = 32


def make(system: str, model: str, int8: str, threads: int) -> Runner:
    if system == "cpu-bf16":
        import openvino as ov

        compiled = ov.Core().compile_model(model, "CPU", {
            "INFERENCE_PRECISION_HINT": "bf16", "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1,
            "INFERENCE_NUM_THREADS": threads})  # fmt: skip
        request = compiled.create_infer_request()
        return lambda x: request.infer({0: x})[0].copy()
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # the core plan's
    path = int8 if system == "cpu-int8" else model
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return lambda x: session.run(None, {name: x})[0]


def run_round(runners: list[Runner], batch: np.ndarray, seconds: float) -> dict[str, float]:
    counts = [0] * len(runners)
    stop = time.monotonic() + seconds

    def loop(i: int) -> None:
        while time.monotonic() < stop:
            runners[i](batch)
            counts[i] += len(batch)

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(len(runners))]
    cpu0, wall0 = time.process_time(), time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    images = sum(counts)
    return {"images": images, "cpu_s": cpu, "wall_s": wall,
            "images_per_cpu_s": images / cpu, "images_per_s": images / wall}  # fmt: skip


def main(argv: list[str]) -> int:
    """``MODEL.onnx INT8.onnx PIXELS.npy OUT_DIR [SECONDS]``, or ``--plot OUT/x.json``."""
    if argv[:1] == ["--plot"]:
        plot(argv[1])
    else:
        measure(*argv)
    return 0


def measure(model: str, int8: str, pixels: str, out: str, seconds: str = "20") -> None:
    import onnxruntime as ort
    import openvino as ov

    batch = np.ascontiguousarray(np.load(pixels)[:BATCH])
    keys = [(s, n, t) for s in ("cpu-bf16", "cpu-int8", "cpu") for n, t in PLANS]
    runners = {k: [make(k[0], model, int8, k[2]) for _ in range(k[1])] for k in keys}
    for found in runners.values():
        for runner in found:
            runner(batch)  # warm-up: first-run allocations and kernel choice
    rounds: dict[str, list[dict[str, float]]] = {f"{s} {n}x{t}": [] for s, n, t in keys}
    load_before = os.getloadavg()[0]
    for _ in range(3):
        for s, n, t in keys:
            rounds[f"{s} {n}x{t}"].append(run_round(runners[(s, n, t)], batch, float(seconds)))
            print(json.dumps({"plan": f"{s} {n}x{t}", **rounds[f"{s} {n}x{t}"][-1]}), flush=True)
    cpu_model = next((line.split(":", 1)[1].strip() for line in
                      Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), platform.processor())  # fmt: skip
    results = {
        "command": "python -m bench cpu-instances MODEL.onnx INT8.onnx PIXELS.npy OUT",
        "machine": {"cpu_model": cpu_model, "nproc": os.cpu_count(),
                    "load_1m_before": load_before, "load_1m_after": os.getloadavg()[0]},
        "versions": {"openvino": ov.__version__, "onnxruntime": ort.__version__},
        "batch": BATCH, "seconds_per_round": float(seconds),
        "plans": {key: {"median_images_per_cpu_s": float(np.median(
                            [r["images_per_cpu_s"] for r in found])),
                        "best_images_per_s": max(r["images_per_s"] for r in found),
                        "rounds": found} for key, found in rounds.items()},
    }  # fmt: skip
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "cpu_instances.json").write_text(json.dumps(results, indent=1) + "\n")
    (Path(out) / "cpu_instances.md").write_text(markdown(results))


def markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    base = results["plans"]["cpu-int8 2x1"]["median_images_per_cpu_s"]
    lines = [
        f"# CPU profiles' model plans, ViT-B/32 image tower (random weights, seed 0), batch "
        f"{results['batch']}",
        "",
        f"{m['cpu_model']}, {m['nproc']} CPUs, shared with other work (load average "
        f"{m['load_1m_before']:.1f} before, {m['load_1m_after']:.1f} after): images per CPU-second"
        " of the measuring process are the figure; images/s only for reference. "
        f"openvino {results['versions']['openvino'].split('-')[0]}, onnxruntime "
        f"{results['versions']['onnxruntime']}. Instances x threads; 3 interleaved rounds of "
        f"{results['seconds_per_round']:.0f} s. Command: `{results['command']}`.",
        "",
        "| profile, instances x threads | images per CPU-second (median) | vs cpu-int8 2x1 "
        "(today's plan) | images/s, best round (shared machine) |",
        "| --- | --- | --- | --- |",
    ]
    for key, found in results["plans"].items():
        per_cpu = found["median_images_per_cpu_s"]
        lines.append(f"| {key} | {per_cpu:.1f} | {per_cpu / base:.2f}x | "
                     f"{found['best_images_per_s']:.1f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def plot(results_json: str) -> None:
    """``python -m bench cpu-instances --plot OUT/cpu_instances.json`` (any env with matplotlib):
    the images per CPU-second of each profile and plan, beside the JSON."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = json.loads(Path(results_json).read_text())
    names = list(results["plans"])
    values = [results["plans"][n]["median_images_per_cpu_s"] for n in names]
    colours = ["tab:green" if n.startswith("cpu-bf16") else "tab:blue" if "int8" in n
               else "tab:gray" for n in names]  # fmt: skip
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.barh(names[::-1], values[::-1], color=colours[::-1])
    for y, v in enumerate(values[::-1]):
        ax.text(v, y, f" {v:.1f}", va="center")
    ax.set_xlabel("images per CPU-second (median of 3 rounds), batch 32")
    ax.set_title("CPU profiles x model plan (instances x threads), ViT-B/32 image tower")
    ax.set_xlim(0, max(values) * 1.18)
    fig.tight_layout()
    fig.savefig(Path(results_json).with_suffix(".png"), dpi=110)
