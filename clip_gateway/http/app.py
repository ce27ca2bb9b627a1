"""App factory and lifespan: the settings turned into the pipeline's own options, the decode
pool, backend and pipeline built per worker, and the one ``AppContext`` on app.state."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from litestar import Litestar
from litestar.exceptions import HTTPException
from litestar.middleware import DefineMiddleware
from opentelemetry.trace import Tracer

from clip_gateway.backend import shm
from clip_gateway.backend.protocol import InferenceBackend
from clip_gateway.config import memory
from clip_gateway.config.plan import plan_for
from clip_gateway.config.processes import stop_with_parent
from clip_gateway.config.settings import ServerSettings
from clip_gateway.errors import EmbeddingError
from clip_gateway.http import connections, docs, head, problems, spread
from clip_gateway.http.auth import load_api_keys, require_api_key
from clip_gateway.http.context import KEY, AppContext
from clip_gateway.http.immich import passthrough
from clip_gateway.http.immich import routes as immich
from clip_gateway.http.routes import ROUTES
from clip_gateway.http.urls import fetch
from clip_gateway.http.urls.fetch import Fetcher, FetchOptions
from clip_gateway.http.urls.guard import Allowlist
from clip_gateway.imaging.paths import current as imaging_path
from clip_gateway.observability.access import ObserveMiddleware
from clip_gateway.observability.metrics import Metrics, forget_dead_workers, multiprocess_dir
from clip_gateway.observability.server_spans import ServerSpans
from clip_gateway.observability.tracing import Telemetry, create_telemetry
from clip_gateway.pipeline.cache import open_cache
from clip_gateway.pipeline.fair import FairExecutor
from clip_gateway.pipeline.service import EmbeddingService, PipelineOptions

BackendFactory = Callable[[ServerSettings, Tracer], InferenceBackend]


def fetcher_for(settings: ServerSettings) -> Fetcher | None:
    """URL items' fetcher under the settings' guard and limits; None while they are off."""
    if not settings.url_inputs:
        return None
    return Fetcher(
        FetchOptions(
            allow=Allowlist.parse(settings.url_allow),
            connect_timeout_s=settings.url_connect_timeout_s,
            total_timeout_s=settings.url_timeout_s,
            max_bytes=settings.max_image_bytes,
            max_fetches=settings.url_max_fetches,
            per_request=settings.url_fetches_per_request,
            per_key=math.ceil(settings.admission_key_share * settings.url_max_fetches),
        )
    )


def triton_backend(settings: ServerSettings, tracer: Tracer) -> InferenceBackend:
    from clip_gateway.backend.triton import TritonBackend

    return TritonBackend(
        settings.triton_url,
        settings.triton_model,
        text_model_name=settings.triton_text_model,
        tracer=tracer,
        shared_memory_regions=settings.shared_memory_regions,
        triton_spans=settings.triton_spans,
        http_url=settings.triton_http_url,
    )


def pipeline_options(settings: ServerSettings, decode_threads: int) -> PipelineOptions:
    """The pipeline's own options, from this process's settings: the pipeline never sees them."""
    return PipelineOptions(
        request_timeout_s=settings.request_timeout_s,
        decode_threads=decode_threads,
        horizon_s=settings.horizon_s,
        max_batch_size=settings.max_batch_size,
        max_image_pixels=settings.max_image_pixels,
        max_image_bytes=settings.max_image_bytes,
        max_decode_bytes=settings.max_decode_mib << 20,
        progressive_dc_only=settings.progressive_dc_only,
        max_text_chars=settings.max_text_chars,
        infer_s_per_image=settings.admission_infer_s_per_image,
        max_body_bytes_in_flight=settings.max_body_mib_in_flight << 20,
        body_timeout_s=settings.body_timeout_s,
        key_share=settings.admission_key_share,
        decode_overspend=settings.admission_decode_overspend,
        decode_speed=settings.decode_speed,
    )


#: The CA bundle as httpx loads it by default, loaded once per process (~27 ms each time).
_tls = functools.cache(httpx.create_ssl_context)


def create_app(
    settings: ServerSettings | None = None,
    backend_factory: BackendFactory = triton_backend,
    *,
    freeze_at_start: bool = False,
    board: Path | None = None,
) -> Litestar:
    """The gateway's app. ``board``: its workers' connection board (http/spread.py), whose
    workers must all be accepting before it is ready."""
    settings = settings or ServerSettings()
    telemetry = create_telemetry(
        settings.tracing, settings.trace_sample_ratio, settings.trace_trust_upstream
    )
    metrics = Metrics()
    api_keys = load_api_keys(settings)

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        stop_with_parent()  # a uvicorn worker whose manager is killed stops too
        memory.tune()  # before the decode threads allocate anything
        if directory := multiprocess_dir():
            forget_dead_workers(directory, shm.alive)  # this worker may replace a dead one
        # Decoding is CPU-bound and releases the GIL: one thread per usable CPU uses them all
        # without oversubscribing; admission control keeps this pool's queue bounded.
        threads = settings.decode_threads or plan_for(0, 0, settings.max_decode_mib).decode_threads
        # served fairly between requests by their priced work (pipeline/fair.py)
        pool = FairExecutor(threads, thread_name_prefix="decode")
        backend = backend_factory(settings, telemetry.tracer)
        cache = open_cache(settings.cache_mib << 20, settings.cache_path)
        pipeline = EmbeddingService(
            backend,
            pool,
            pipeline_options(settings, threads),
            tracer=telemetry.tracer,
            metrics=metrics,
            cache=cache,
        )
        canary = pipeline.canary(
            settings.canary_interval_s, settings.canary_min_cosine, timeout_s=30.0
        )
        http = httpx.AsyncClient(timeout=5.0, verify=_tls())
        workers = spread.Board(board) if board is not None else None
        app.state[KEY] = AppContext(
            settings=settings,
            pipeline=pipeline,
            canary=canary,
            telemetry=telemetry,
            metrics=metrics,
            api_keys=api_keys,
            http=http,
            imaging=imaging_path(),
            workers_accepting=workers.accepting if workers is not None else None,
        )
        if (fetcher := fetcher_for(settings)) is not None:  # URL items' (http/urls/)
            app.state[fetch.KEY] = fetcher
        canary_task = asyncio.create_task(canary.run()) if canary.enabled else None
        try:
            async with passthrough.opened(app.state, settings):  # Immich's upstream, if any
                await pipeline.warm()
                if freeze_at_start:
                    # What startup made lives as long as the worker: kept out of the collector,
                    # a full collection walks hundreds of objects instead of ~100,000 (0.1-0.4
                    # CPU-s on a loaded 2-core VM, in whichever thread allocates next: a decode
                    # thread's included). A server's worker only: frozen cycles are never freed.
                    gc.collect()
                    gc.freeze()
                yield
        finally:
            if canary_task is not None:
                canary_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await canary_task
            await http.aclose()
            await backend.close()
            if workers is not None:
                workers.close()
            if cache is not None:
                cache.close()
            pool.shutdown(wait=True, cancel_futures=True)
            telemetry.shutdown()

    app = Litestar(
        route_handlers=[
            *ROUTES,
            *(immich.routes(settings) if settings.immich else ()),
            docs.assets(),
        ],
        lifespan=[lifespan],
        middleware=_middleware(telemetry, metrics),
        guards=[require_api_key],
        exception_handlers={
            EmbeddingError: problems.respond,
            HTTPException: problems.respond,
            Exception: problems.internal_error,
        },
        # bodies are read and bounded by http/body.py; Litestar's own reader, unused by the
        # routes, holds the same limit rather than its 10 MB default
        request_max_body_size=settings.max_body_bytes,
        # The process entry point configures logging (observability/logs.py); Litestar's
        # default would replace the root handlers with its own text format.
        logging_config=None,
        openapi_config=docs.openapi_config(bool(api_keys)),
    )
    app.asgi_handler = head.as_get(app.asgi_handler)
    return app


def retry_after_s(app: Litestar) -> float:
    """Seconds a client refused at the connection limit should wait: this app's admitted
    backlog (connections free as that work finishes); 1 before its lifespan has begun."""
    context: AppContext | None = app.state.get(KEY)
    return context.pipeline.admission.backlog_s if context is not None else 1.0


class ServerConfig(uvicorn.Config):
    """uvicorn's config for the gateway: each worker builds its app (``create_app``, settings
    from its environment) and serves it with the HTTP protocol bound to that app (its head
    limits, its admission's Retry-After), passed to every connection as arguments. With a
    ``board`` (several workers: ``spread.Board.create``), the workers share connections evenly
    (http/spread.py)."""

    def __init__(self, *args: Any, board: Path | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.board = board

    def get_loop_factory(self) -> Callable[[], asyncio.AbstractEventLoop] | None:
        factory = super().get_loop_factory()
        if factory is None or self.board is None:
            return factory
        return spread.balanced(factory, self.board)

    def load_app(self) -> Callable[[], Litestar]:
        return self._create_app

    def _create_app(self) -> Litestar:
        settings = ServerSettings()
        app = create_app(settings, freeze_at_start=True, board=self.board)
        self._protocol = connections.protocol(
            connections.HeadLimits.of(settings), functools.partial(retry_after_s, app)
        )
        return app

    def load(self) -> None:
        super().load()
        self.http_protocol_class = self._protocol  # type: ignore[assignment]
        # No route is a WebSocket endpoint: uvicorn's WebSocket protocol would take an upgrade
        # request past every head and body deadline (and answer a handshake the app cannot
        # complete with a 500); without it the HTTP protocol refuses every switch at once.
        self.ws_protocol_class = None


def _middleware(telemetry: Telemetry, metrics: Metrics) -> list[Any]:
    """Tracing (only when on) outermost, so the observation middleware sees the server span."""
    stack: list[Any] = []
    if telemetry.enabled:
        stack.append(
            DefineMiddleware(
                ServerSpans, tracer=telemetry.tracer, exclude=("/healthz", "/readyz", "/metrics")
            )
        )
    stack.append(ObserveMiddleware(metrics))
    return stack
