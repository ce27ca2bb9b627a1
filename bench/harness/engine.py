"""A graph alone in ONNX Runtime (the ``cuda`` profile's options on a GPU) and open_clip in torch
FP16 on device tensors, timed the same way: the engine-side ceilings the gpu and host studies
measure."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

CUDA_OPTIONS = {"cudnn_conv_algo_search": "HEURISTIC", "enable_cuda_graph": "0"}


def session(path: Path, provider: str) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    if provider == "CUDAExecutionProvider":
        providers: list[Any] = [(provider, CUDA_OPTIONS)]
    else:  # ORT_ENABLE_ALL's CPU layout transforms crash on the FP16 graph
        # (clip_gateway/export/parity.py)
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        providers = [provider]
    session = ort.InferenceSession(str(path), options, providers=providers)
    if session.get_providers()[0] != provider:
        raise RuntimeError(f"{provider} not active for {path.name}: {session.get_providers()}")
    return session


def rate(run: Any, batch: int, min_seconds: float) -> dict[str, float]:
    """Items per second over at least ``min_seconds`` after three warm-up calls."""
    for _ in range(3):
        run()
    calls, started = 0, time.perf_counter()
    latencies = []
    while (elapsed := time.perf_counter() - started) < min_seconds or calls < 5:
        t0 = time.perf_counter()
        run()
        latencies.append(time.perf_counter() - t0)
        calls += 1
    return {
        "items_per_s": round(calls * batch / elapsed, 1),
        "ms_per_batch_p50": round(1000 * float(np.median(latencies)), 3),
        "calls": calls,
    }


def torch_fp16(loaded: Any, size: int, batches: tuple[int, ...], seconds: float) -> dict[str, Any]:
    import torch

    model = loaded.clip.half().cuda().eval()
    rates = {}
    for batch in batches:
        x = torch.randn(batch, 3, size, size, device="cuda", dtype=torch.float16)

        def run(x: Any = x) -> None:
            with torch.no_grad():
                model.encode_image(x)
            torch.cuda.synchronize()

        rates[str(batch)] = rate(run, batch, seconds)
    loaded.clip.float().cpu()
    return rates
