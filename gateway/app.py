"""App factory and lifespan: settings, decode pool, backend and service live on app.state."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

import httpx
from litestar import Litestar, Request, Response
from litestar.datastructures import State
from litestar.exceptions import HTTPException
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import ScalarRenderPlugin
from litestar.openapi.spec import Components, SecurityScheme
from litestar.plugins.opentelemetry import OpenTelemetryConfig
from litestar.plugins.problem_details import ProblemDetailsException
from opentelemetry.trace import Tracer

from gateway import __version__
from gateway.auth import load_api_keys, require_api_key
from gateway.backend import InferenceBackend
from gateway.canary import Canary
from gateway.errors import GatewayError
from gateway.metrics import Metrics
from gateway.observe import ObserveMiddleware
from gateway.routes import ROUTES
from gateway.service import EmbeddingService
from gateway.settings import GatewaySettings
from gateway.telemetry import Telemetry, create_telemetry

log = logging.getLogger("gateway")

BackendFactory = Callable[[GatewaySettings, Tracer], InferenceBackend]
#: Litestar's own HTTP errors (body too large, bad query parameter, ...) as rejection reasons.
_HTTP_REASONS = {
    400: "invalid-request",
    404: "not-found",
    405: "method-not-allowed",
    413: "payload-too-large",
}


def triton_backend(settings: GatewaySettings, tracer: Tracer) -> InferenceBackend:
    from gateway.triton_backend import TritonBackend

    return TritonBackend(
        settings.triton_url,
        settings.triton_model,
        tracer=tracer,
        shared_memory_regions=settings.shared_memory_regions,
    )


def problem(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """Our errors and Litestar's HTTP errors, as RFC 9457 problem details; counted by reason."""
    if isinstance(exc, GatewayError):
        details, reason = exc.to_problem(), exc.slug
    else:
        assert isinstance(exc, HTTPException)
        details = ProblemDetailsException(
            detail=exc.detail, status_code=exc.status_code, headers=exc.headers, extra=exc.extra
        )
        reason = _HTTP_REASONS.get(exc.status_code, f"http-{exc.status_code}")
    request.app.state.metrics.rejected.labels(reason).inc()
    return details.to_response(request)


def internal_error(request: Request[Any, Any, Any], exc: Exception) -> Response[dict[str, Any]]:
    """Anything not raised on purpose: log it, answer 500 without leaking its text."""
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    request.app.state.metrics.rejected.labels("internal").inc()
    return Response(
        {"type": "about:blank", "title": "Internal Server Error", "status": 500},
        status_code=500,
        media_type="application/problem+json",
    )


def create_app(
    settings: GatewaySettings | None = None, backend_factory: BackendFactory = triton_backend
) -> Litestar:
    settings = settings or GatewaySettings()
    telemetry = create_telemetry(settings.tracing)
    metrics = Metrics()
    api_keys = load_api_keys(settings)

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        # Decoding is CPU-bound and releases the GIL: one thread per core uses them all without
        # oversubscribing; admission control keeps this pool's queue bounded.
        pool = ThreadPoolExecutor(settings.decode_workers, thread_name_prefix="decode")
        backend = backend_factory(settings, telemetry.tracer)
        app.state.service = EmbeddingService(
            backend, pool, settings, tracer=telemetry.tracer, metrics=metrics
        )
        app.state.http = httpx.AsyncClient(timeout=5.0)
        canary = Canary(
            backend, settings.canary_interval_s, settings.canary_min_cosine, timeout_s=30.0
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

    return Litestar(
        route_handlers=ROUTES,
        lifespan=[lifespan],
        state=State(
            {
                "settings": settings,
                "telemetry": telemetry,
                "metrics": metrics,
                "api_keys": api_keys,
            }
        ),
        middleware=_middleware(telemetry, metrics),
        guards=[require_api_key],
        exception_handlers={
            GatewayError: problem,
            HTTPException: problem,
            Exception: internal_error,
        },
        request_max_body_size=settings.max_body_bytes,
        # The process entry point configures logging (gateway/logs.py); Litestar's default would
        # replace the root handlers with its own text format.
        logging_config=None,
        openapi_config=OpenAPIConfig(
            title="CLIP gateway",
            version=__version__,
            description="CLIP image embeddings from compact JPEG batches; OpenAI-compatible.",
            path="/docs",
            render_plugins=[ScalarRenderPlugin()],
            # Declared only when keys are configured: the document says what this server does.
            components=Components(
                security_schemes={
                    "bearer": SecurityScheme(
                        type="http",
                        scheme="bearer",
                        description="Every route but /healthz and /readyz needs a key.",
                    )
                }
                if api_keys
                else None
            ),
            security=[{"bearer": []}] if api_keys else None,
        ),
    )


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
