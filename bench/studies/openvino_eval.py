"""OpenVINO beside ONNX Runtime for the CPU profiles, on the exported image graph (issue 25).

``python -m bench openvino-eval MODEL.onnx INT8.onnx OUT_DIR`` in a virtualenv with ``openvino``,
``onnxruntime``, ``numpy`` and, for OpenVINO's own INT8, ``nncf`` (none of them a project dependency
of the gateway: this is the measurement that decides). OpenVINO's INT8 rows need ``calibration.npy``
beside MODEL.onnx: the quality gate's calibration photos as the model's uint8 input, which NNCF
calibrates on. Batch 32 of the gateway's own uint8 pixels (compact JPEGs through ``preprocess()``,
made by the caller as ``pixels.npy`` in OUT_DIR), two threads each, the systems interleaved round by
round so background load hits them alike. Figures: images per CPU-second of this process (median
round; ONNX Runtime's spin-waiting off so its CPU time is work) and the best round's images/s (wall
clock, meaningful only on an idle machine); fidelity as the cosine of each system's embeddings
against ONNX Runtime FP32's.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def systems(
    model: str, int8: str, *, nncf_int8: bool = True
) -> dict[str, Callable[[np.ndarray], np.ndarray]]:
    import onnxruntime as ort
    import openvino as ov

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = 2, 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    out: dict[str, Callable[[np.ndarray], np.ndarray]] = {}
    for key, path in (("onnxruntime-fp32", model), ("onnxruntime-int8-dynamic", int8)):
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name

        def run(x: np.ndarray, s: Any = session, n: str = name) -> np.ndarray:
            return s.run(None, {n: x})[0]  # type: ignore[no-any-return]

        out[key] = run
    core = ov.Core()
    for precision in ("f32", "bf16"):
        out[f"openvino-{'fp32' if precision == 'f32' else precision}"] = _openvino(
            core, model, precision
        )
    calibration = Path(model).parent / "calibration.npy"
    if nncf_int8 and calibration.exists():
        photos = np.load(calibration)
        for alpha in NNCF_SMOOTH_QUANT:
            quantized = _nncf_int8(core, model, photos, alpha)
            # the ops NNCF leaves unquantized run in BF16 (the CPU's default here) or FP32
            for rest in ("bf16", "f32") if alpha is None else ("bf16",):
                smooth = "default SmoothQuant" if alpha is None else f"SmoothQuant alpha {alpha}"
                key = f"openvino-int8-nncf ({smooth}, {'fp32' if rest == 'f32' else rest} rest)"
                out[key] = _openvino(core, quantized, rest)
    return out


def _openvino(core: Any, model: Any, precision: str) -> Callable[[np.ndarray], np.ndarray]:
    """``model`` (a path or an OpenVINO model) compiled for the CPU at ``precision``, two
    threads, one request."""
    compiled = core.compile_model(
        model,
        "CPU",
        {"INFERENCE_PRECISION_HINT": precision, "INFERENCE_NUM_THREADS": 2,
         "PERFORMANCE_HINT": "LATENCY"},
    )  # fmt: skip
    request = compiled.create_infer_request()
    return lambda x: request.infer({0: x})[0].copy()


#: NNCF's SmoothQuant strength on the MatMuls: its transformer preset's own (None), and the one of
#: -1 (off), 0.02, 0.05, 0.15 and 0.3 that kept ViT-B/32 nearest FP32 in a sweep (0.3).
NNCF_SMOOTH_QUANT: tuple[float | None, ...] = (None, 0.3)


def _nncf_int8(core: Any, model: str, calibration: np.ndarray, alpha: float | None) -> Any:
    """OpenVINO's own post-training INT8 (NNCF, its transformer preset: per-channel weights,
    SmoothQuant on the MatMuls at strength ``alpha``), calibrated on ``calibration`` (the quality
    gate's photos, never the pixels measured), one image per sample as the server's batches vary."""
    import nncf
    from nncf.quantization.advanced_parameters import (
        AdvancedQuantizationParameters,
        AdvancedSmoothQuantParameters,
    )

    advanced = (
        None
        if alpha is None
        else AdvancedQuantizationParameters(
            smooth_quant_alphas=AdvancedSmoothQuantParameters(matmul=alpha)
        )
    )
    dataset = nncf.Dataset([calibration[i : i + 1] for i in range(len(calibration))])
    return nncf.quantize(
        core.read_model(model),
        dataset,
        model_type=nncf.ModelType.TRANSFORMER,
        subset_size=len(calibration),
        advanced_parameters=advanced,
    )


def measure(model: str, int8: str, pixels: np.ndarray, rounds: int) -> dict[str, dict[str, float]]:
    runs = systems(model, int8)
    reference = runs["onnxruntime-fp32"](pixels)
    results: dict[str, dict[str, float]] = {}
    cpu: dict[str, list[float]] = {key: [] for key in runs}
    wall: dict[str, list[float]] = {key: [] for key in runs}
    for key, run in runs.items():
        got = run(pixels)
        cosine = (got * reference).sum(1) / np.linalg.norm(got, axis=1)
        cosine /= np.linalg.norm(reference, axis=1)
        results[key] = {"cosine_mean": float(cosine.mean()), "cosine_min": float(cosine.min())}
    for _ in range(rounds):
        for key, run in runs.items():
            started, cpu_started = time.perf_counter(), time.process_time()
            run(pixels)
            wall[key].append(time.perf_counter() - started)
            cpu[key].append(time.process_time() - cpu_started)
    n = len(pixels)
    for key in runs:
        results[key]["images_per_cpu_s"] = round(n / float(np.median(cpu[key])), 1)
        results[key]["images_per_s_best"] = round(n / min(wall[key]), 1)
    return results


def markdown(results: dict[str, dict[str, float]], header: str = "") -> str:
    base = results["onnxruntime-fp32"]["images_per_cpu_s"]
    best_today = results["onnxruntime-int8-dynamic"]["images_per_cpu_s"]
    lines = [header, ""] if header else []
    lines += [
        "| system | images per CPU-second | vs ORT FP32 | vs ORT INT8 (today's best) "
        "| cosine vs ORT FP32, mean (min) | images/s, best round (shared machine) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for key, row in results.items():
        lines.append(
            f"| {key} | {row['images_per_cpu_s']} | {row['images_per_cpu_s'] / base:.2f}x "
            f"| {row['images_per_cpu_s'] / best_today:.2f}x "
            f"| {row['cosine_mean']:.6f} ({row['cosine_min']:.6f}) | {row['images_per_s_best']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    model, int8, out = argv[0], argv[1], Path(argv[2])
    pixels = np.load(out / "pixels.npy")
    results = measure(model, int8, pixels, rounds=5)
    (out / "openvino.json").write_text(json.dumps(results, indent=1))
    (out / "openvino.md").write_text(markdown(results, _header()))
    print(markdown(results))
    return 0


def _header() -> str:
    """What ran where: the CPU's name and matrix flags, the runtimes' versions, the load."""
    import platform
    from importlib import metadata

    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines()
                 if line.startswith("model name")), platform.processor())  # fmt: skip
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines()
                  if line.startswith("flags")), [])  # fmt: skip
    wanted = ("avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")
    versions = []
    for package in ("openvino", "nncf", "onnxruntime"):
        try:
            versions.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            continue
    return (
        f"Machine: {name}, {os.cpu_count()} cores "
        f"({', '.join(f for f in wanted if f in flags)}); load average "
        f"{os.getloadavg()[0]:.1f} at the end; {', '.join(versions)}. Images per CPU-second of "
        "the measuring process are the figure (median of 5 interleaved rounds), images/s only "
        "for reference."
    )
