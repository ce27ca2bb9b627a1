"""Container entrypoint: pick the profile, render the repository, run Triton and the gateway.

1. detect the GPU (NVML) and choose ``cuda`` / ``tensorrt`` / ``cpu`` (gateway/gpu.py), or
   measure both GPU profiles once (``GATEWAY_CALIBRATE=true``) and keep the winner beside the
   TensorRT engine cache;
2. render the model repository for that profile from the baked-in export;
3. start tritonserver on 127.0.0.1 with model control off (and OpenTelemetry tracing when an
   OTLP endpoint is configured) and wait until the model is READY — for TensorRT that is after
   the engines for every served batch size have been built (``model_warmup``);
4. start the gateway with N uvicorn workers;
5. supervise: if either process dies the other is stopped and the container exits non-zero;
   SIGTERM stops the gateway first (uvicorn drains in-flight requests), then Triton, and exits 0.

Runs the same way outside Docker (``python -m gateway.entrypoint``), with the PyPI Triton.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from gateway import gpu
from gateway.contract import TRITON_MODEL_NAME
from gateway.launch import GatewayProcess
from gateway.localtriton import LocalTriton, otel_trace_args, otlp_traces_url
from gateway.logs import configure
from gateway.repository import RepositorySettings, render
from gateway.settings import GatewaySettings

log = logging.getLogger("gateway.entrypoint")


class EntrypointSettings(BaseSettings):
    """What the container entrypoint reads (env prefix ``GATEWAY_``)."""

    model_config = SettingsConfigDict(env_prefix="GATEWAY_", frozen=True, extra="ignore")

    #: An export directory (``python -m export``): model.onnx, model_fp16.onnx, manifest.json.
    model_dir: Path = Path("/models/export")
    #: Where the repository for the chosen profile is rendered (writable; /tmp is an emptyDir).
    repository_dir: Path = Path(tempfile.gettempdir()) / "clip-gateway" / "model_repository"
    #: ``auto`` detects the GPU and looks it up (or uses a calibration); or force a profile.
    triton_profile: Literal["auto", "cpu", "cuda", "tensorrt"] = "auto"
    #: Measure both GPU profiles on first start and keep the winner (cached with the engines).
    calibrate: bool = False
    #: Triton's loopback ports (never published).
    triton_grpc_port: int = 8001
    triton_http_port: int = 8002
    triton_metrics_port: int = 8003
    #: Seconds SIGTERM leaves the gateway to finish in-flight requests before it is killed.
    drain_s: float = Field(30.0, gt=0)


def worker_plan(cpus: int, workers: int, threads: int) -> tuple[int, int]:
    """(uvicorn workers, decode threads per worker) for ``cpus`` cores when unset (0).

    HTTP parsing, multipart and the gRPC client run on each worker's event loop and hold about
    one core at full load, while decoding releases the GIL and scales with threads. One worker
    per four cores (at most 8) with threads filling the rest keeps every core busy without
    oversubscribing: 16 cores -> 4 workers x 4 threads; 2 cores -> 1 x 2.
    """
    workers = workers or max(1, min(8, cpus // 4))
    threads = threads or max(1, cpus // workers)
    return workers, threads


def _model_id(model_dir: Path) -> str:
    return f"{model_dir.resolve().name}"


def choose_profile(settings: EntrypointSettings) -> tuple[gpu.Profile, str]:
    found = gpu.detect()
    if found is not None:
        log.info("GPU: %s, compute capability %s, %.0f GiB", found.name,
                 found.compute_capability, found.memory_gib)  # fmt: skip
    record = Path(RepositorySettings(profile="tensorrt").trt_cache_path) / "calibration.json"
    return gpu.choose(
        settings.triton_profile,
        found,
        model=_model_id(settings.model_dir),
        record=record,
        calibrate_now=settings.calibrate,
        timer=lambda profile: time_profile(profile, settings),
    )


def time_profile(profile: gpu.Profile, settings: EntrypointSettings) -> dict[str, float]:
    """Milliseconds per image at batch 1 and at the max batch, with ``profile`` loaded."""
    from gateway.triton_backend import TritonBackend

    out = settings.repository_dir.parent / f"calibrate-{profile}"
    repository = render(RepositorySettings(profile=profile), settings.model_dir, out)

    async def measure(url: str) -> dict[str, float]:
        backend = TritonBackend(url, TRITON_MODEL_NAME)
        try:
            info = await backend.model_info()
            timings = {}
            for key, batch in (("1", 1), ("max", info.max_batch_size)):
                pixels = np.random.default_rng(0).integers(
                    0, 256, (batch, info.image_size, info.image_size, 3), dtype=np.uint8
                )
                for _ in range(3):
                    await backend.infer(pixels, deadline=time.monotonic() + 600)
                started = time.perf_counter()
                for _ in range(20):
                    await backend.infer(pixels, deadline=time.monotonic() + 600)
                timings[key] = (time.perf_counter() - started) / 20 / batch * 1000
            return timings
        finally:
            await backend.close()

    with LocalTriton(repository, inherit_output=True) as triton:
        return asyncio.run(measure(triton.grpc_url))


def main() -> int:
    settings = EntrypointSettings()
    gateway_settings = GatewaySettings()
    configure(gateway_settings.log_level, gateway_settings.log_format)
    profile, reason = choose_profile(settings)
    log.info("Triton profile %s (%s)", profile, reason)
    repository = render(
        RepositorySettings(profile=profile), settings.model_dir, settings.repository_dir
    )
    traces = otlp_traces_url()
    triton = LocalTriton(
        repository,
        grpc_port=settings.triton_grpc_port,
        http_port=settings.triton_http_port,
        metrics_port=settings.triton_metrics_port,
        extra_args=otel_trace_args(traces) if traces else (),
        inherit_output=True,
    )
    workers, threads = worker_plan(
        len(os.sched_getaffinity(0)), gateway_settings.workers, gateway_settings.decode_threads
    )
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    started = time.monotonic()
    triton.start(timeout=3600)  # TensorRT engine builds can take minutes on first start
    log.info("Triton READY after %.1f s", time.monotonic() - started)
    env = {
        "GATEWAY_WORKERS": str(workers),
        "GATEWAY_DECODE_THREADS": str(threads),
        "GATEWAY_TRITON_METRICS_URL": triton.metrics_url,
        "GATEWAY_REQUEST_TIMEOUT_S": str(gateway_settings.request_timeout_s),
    }
    if workers > 1:
        env["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="gateway-metrics-")
    gateway = GatewayProcess(
        triton.grpc_url,
        env=env,
        host=gateway_settings.host,
        port=gateway_settings.port,
        inherit_output=True,
    )
    try:
        gateway.start()
        log.info(
            "gateway on port %d: %d workers x %d decode threads", gateway.port, workers, threads
        )
        failed = supervise(triton, gateway, stop)
    finally:
        gateway.stop(grace=settings.drain_s)
        triton.stop()
    return 1 if failed else 0


def supervise(triton: LocalTriton, gateway: GatewayProcess, stop: threading.Event) -> bool:
    """Wait for SIGTERM/SIGINT (False) or for either child to exit (True: a failure)."""
    while not stop.wait(0.5):
        for name, child in (("tritonserver", triton), ("gateway", gateway)):
            if child.process is None or child.process.poll() is not None:
                code = None if child.process is None else child.process.returncode
                log.error("%s exited (code %s); stopping the other", name, code)
                return True
    log.info("stop requested: draining the gateway, then stopping Triton")
    return False


if __name__ == "__main__":
    sys.exit(main())
