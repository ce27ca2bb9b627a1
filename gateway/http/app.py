"""App factory and lifespan: settings, decode pool, backend and service live on app.state."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

import httpx
from litestar import Litestar
from litestar.datastructures import State
from litestar.exceptions import HTTPException
from litestar.plugins.opentelemetry import OpenTelemetryConfig
from opentelemetry.trace import Tracer

from gateway.backend import shm
from gateway.backend.protocol import InferenceBackend
from gateway.errors import EmbeddingError
from gateway.http import docs, head, immich, problems
from gateway.http.auth import load_api_keys, require_api_key
from gateway.http.protocol import DeadlineProtocol
from gateway.http.routes import ROUTES
from gateway.imaging.paths import current as imaging_path
from gateway.observability.access import ObserveMiddleware
from gateway.observability.metrics import Metrics, forget_dead_workers, multiprocess_dir
from gateway.observability.tracing import Telemetry, create_telemetry
from gateway.pipeline.canary import Canary
from gateway.pipeline.service import EmbeddingService
from gateway.runtime import memory
from gateway.runtime.plan import plan_for
from gateway.runtime.processes import exit_with_parent
from gateway.runtime.settings import ServerSettings

BackendFactory = Callable[[ServerSettings, Tracer], InferenceBackend]


def triton_backend(settings: ServerSettings, tracer: Tracer) -> InferenceBackend:
    from gateway.backend.triton import TritonBackend

    return TritonBackend(
        settings.triton_url,
        settings.triton_model,
        text_model_name=settings.triton_text_model,
        tracer=tracer,
        shared_memory_regions=settings.shared_memory_regions,
    )


def create_app(
    settings: ServerSettings | None = None, backend_factory: BackendFactory = triton_backend
) -> Litestar:
    settings = settings or ServerSettings()
    DeadlineProtocol.header_timeout_s = settings.header_timeout_s  # this worker's connections
    telemetry = create_telemetry(
        settings.tracing, settings.trace_sample_ratio, settings.trace_trust_upstream
    )
    metrics = Metrics()
    api_keys = load_api_keys(settings)

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        exit_with_parent()  # a uvicorn worker whose manager is killed stops too
        memory.tune()  # before the decode threads allocate anything
        if directory := multiprocess_dir():
            forget_dead_workers(directory, shm.alive)  # this worker may replace a dead one
        # Decoding is CPU-bound and releases the GIL: one thread per usable CPU uses them all
        # without oversubscribing; admission control keeps this pool's queue bounded.
        threads = settings.decode_threads or plan_for(0, 0, settings.max_decode_mib).decode_threads
        pool = ThreadPoolExecutor(threads, thread_name_prefix="decode")
        backend = backend_factory(settings, telemetry.tracer)
        app.state.service = service = EmbeddingService(
            backend,
            pool,
            settings,
            decode_threads=threads,
            tracer=telemetry.tracer,
            metrics=metrics,
        )
        DeadlineProtocol.retry_after_s = lambda: service.admission.backlog_s
        app.state.http = httpx.AsyncClient(timeout=5.0)
        app.state.imaging = imaging_path()  # which PIL this process imported: it cannot change
        canary = Canary(
            backend,
            settings.canary_interval_s,
            settings.canary_min_cosine,
            timeout_s=30.0,
            texts=service.texts,
        )
        app.state.canary = canary
        canary_task = asyncio.create_task(canary.run()) if canary.enabled else None
        try:
            yield
        finally:
            if canary_task is not None:
                canary_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await canary_task
            await app.state.http.aclose()
            await backend.close()
            pool.shutdown(wait=True, cancel_futures=True)
            telemetry.shutdown()

    app = Litestar(
        route_handlers=[*ROUTES, *(immich.ROUTES if settings.immich else ()), docs.assets()],
        lifespan=[lifespan],
        state=State(
            {"settings": settings, "telemetry": telemetry, "metrics": metrics, "api_keys": api_keys}
        ),
        middleware=_middleware(telemetry, metrics),
        guards=[require_api_key],
        exception_handlers={
            EmbeddingError: problems.respond,
            HTTPException: problems.respond,
            Exception: problems.internal_error,
        },
        request_max_body_size=settings.max_body_bytes,
        # The process entry point configures logging (observability/logs.py); Litestar's
        # default would replace the root handlers with its own text format.
        logging_config=None,
        openapi_config=docs.openapi_config(bool(api_keys)),
    )
    app.asgi_handler = head.as_get(app.asgi_handler)
    return app


def _middleware(telemetry: Telemetry, metrics: Metrics) -> list[Any]:
    """Tracing (only when on) outermost, so the observation middleware sees the server span."""
    stack: list[Any] = []
    if telemetry.enabled:
        config = OpenTelemetryConfig(
            tracer_provider=telemetry.provider,
            exclude_spans=["receive", "send"],  # one span per body chunk is noise
            exclude=["/healthz", "/readyz", "/metrics"],
        )
        stack.append(config.middleware)
    stack.append(ObserveMiddleware(metrics))
    return stack
