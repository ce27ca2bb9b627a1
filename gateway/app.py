"""App factory and lifespan: settings, decode pool, backend and service live on app.state."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

from litestar import Litestar, Request, Response
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import ScalarRenderPlugin
from litestar.plugins.problem_details import ProblemDetailsConfig, ProblemDetailsPlugin

from gateway import __version__
from gateway.backend import InferenceBackend
from gateway.errors import GatewayError
from gateway.routes import ROUTES
from gateway.service import EmbeddingService
from gateway.settings import GatewaySettings

log = logging.getLogger("gateway")

BackendFactory = Callable[[GatewaySettings], InferenceBackend]


def triton_backend(settings: GatewaySettings) -> InferenceBackend:
    from gateway.triton_backend import TritonBackend

    return TritonBackend(settings.triton_url, settings.triton_model)


def internal_error(request: Request[Any, Any, Any], exc: Exception) -> Response[dict[str, Any]]:
    """Anything not raised on purpose: log it, answer 500 without leaking its text."""
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return Response(
        {"type": "about:blank", "title": "Internal Server Error", "status": 500},
        status_code=500,
        media_type="application/problem+json",
    )


def create_app(
    settings: GatewaySettings | None = None, backend_factory: BackendFactory = triton_backend
) -> Litestar:
    settings = settings or GatewaySettings()

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        # Decoding is CPU-bound and releases the GIL: one thread per core uses them all without
        # oversubscribing; admission control keeps this pool's queue bounded.
        pool = ThreadPoolExecutor(settings.decode_workers, thread_name_prefix="decode")
        backend = backend_factory(settings)
        app.state.service = EmbeddingService(backend, pool, settings)
        try:
            yield
        finally:
            await backend.close()
            pool.shutdown(wait=True, cancel_futures=True)

    problem_details = ProblemDetailsPlugin(
        ProblemDetailsConfig(
            enable_for_all_http_exceptions=True,
            exception_to_problem_detail_map={GatewayError: GatewayError.to_problem},
        )
    )
    return Litestar(
        route_handlers=ROUTES,
        lifespan=[lifespan],
        state=_state(settings),
        plugins=[problem_details],
        exception_handlers={Exception: internal_error},
        request_max_body_size=settings.max_body_bytes,
        openapi_config=OpenAPIConfig(
            title="CLIP gateway",
            version=__version__,
            description="CLIP image embeddings from compact JPEG batches; OpenAI-compatible.",
            path="/docs",
            render_plugins=[ScalarRenderPlugin()],
        ),
    )


def _state(settings: GatewaySettings) -> Any:
    from litestar.datastructures import State

    return State({"settings": settings})
