"""Batch-32 inference over plain gRPC vs Triton system shared memory (same host), per model.

The gateway and Triton share a host, so the input tensor could travel through a shared-memory
region instead of the gRPC message. Measured here to decide whether the gateway should.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from clip_gateway.launcher.local import LocalTriton
from clip_gateway.model.contract import INPUT_NAME, OUTPUT_NAME, TRITON_MODEL_NAME


def compare(
    repositories: dict[str, Path], work: Path, calls: int, batch: int = 32
) -> dict[str, Any]:
    results: dict[str, Any] = {"batch": batch, "calls": calls}
    for label, repo in repositories.items():
        with LocalTriton(repo, log_path=work / f"shm-{label.replace('/', '')}.log") as triton:
            results[label] = _measure(triton.grpc_url, calls, batch)
    return results


def _measure(url: str, calls: int, batch: int) -> dict[str, float]:
    import tritonclient.grpc as grpcclient
    import tritonclient.utils.shared_memory as shm

    pixels = np.random.default_rng(0).integers(0, 256, (batch, 224, 224, 3), dtype=np.uint8)
    client = grpcclient.InferenceServerClient(url)
    plain = grpcclient.InferInput(INPUT_NAME, list(pixels.shape), "UINT8")
    outputs = [grpcclient.InferRequestedOutput(OUTPUT_NAME)]

    def grpc_call() -> None:
        plain.set_data_from_numpy(pixels)  # serialising the tensor is part of the gRPC path
        client.infer(TRITON_MODEL_NAME, [plain], outputs=outputs)

    name, key = "bench_input", f"/bench_input_{time.monotonic_ns()}"
    region = shm.create_shared_memory_region(name, key, pixels.nbytes)
    client.register_system_shared_memory(name, key, pixels.nbytes)
    shared = grpcclient.InferInput(INPUT_NAME, list(pixels.shape), "UINT8")
    shared.set_shared_memory(name, pixels.nbytes)

    def shm_call() -> None:
        shm.set_shared_memory_region(region, [pixels])  # the gateway would decode into it
        client.infer(TRITON_MODEL_NAME, [shared], outputs=outputs)

    try:
        timings = {"grpc_ms": _time(grpc_call, calls), "shm_ms": _time(shm_call, calls)}
    finally:
        _unregister(client, name)
        shm.destroy_shared_memory_region(region)
        client.close()
    timings["saved_ms"] = round(timings["grpc_ms"] - timings["shm_ms"], 3)
    return timings


def _unregister(client: Any, name: str, within_s: float = 10.0) -> None:
    """Triton answers an infer before it releases the request's hold on the region, so an
    unregister right after the last call can find it "currently in use": retry until released."""
    from tritonclient.utils import InferenceServerException

    deadline = time.monotonic() + within_s
    while True:
        try:
            client.unregister_system_shared_memory(name)
            return
        except InferenceServerException as exc:
            if "in use" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _time(call: Any, calls: int) -> float:
    call()
    call()  # warm
    started = time.perf_counter()
    for _ in range(calls):
        call()
    return round((time.perf_counter() - started) / calls * 1000, 3)
