"""What every route works with, in one typed object on ``app.state``: the settings, the
pipeline, its canary, telemetry, metrics and the few clients the app holds. Built once per
worker by the lifespan (http/app.py); handlers fetch it with ``app_context``."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from litestar.datastructures import State

from clip_gateway.config.settings import ServerSettings
from clip_gateway.http.fetch import Fetcher
from clip_gateway.http.upstream import Upstream
from clip_gateway.imaging.paths import ImagingPath
from clip_gateway.observability.metrics import Metrics
from clip_gateway.observability.tracing import Telemetry
from clip_gateway.pipeline.canary import Canary
from clip_gateway.pipeline.service import EmbeddingService


@dataclass(frozen=True)
class AppContext:
    settings: ServerSettings
    #: The embedding pipeline (pipeline/service.py): admission, embedding, capabilities.
    pipeline: EmbeddingService
    canary: Canary
    telemetry: Telemetry
    metrics: Metrics
    #: API keys (empty: none needed), as http/auth.py compares them.
    api_keys: tuple[bytes, ...]
    #: For /metrics/triton's upstream.
    http: httpx.AsyncClient
    #: Which PIL this process imported: it cannot change.
    imaging: ImagingPath
    #: URL items' fetcher (http/fetch.py); None: URL items are off.
    fetcher: Fetcher | None = None
    #: Immich's own ML server(s) for what /predict does not serve (None: not configured).
    upstream: Upstream | None = None


#: The key of the context on ``app.state``.
KEY = "context"


def app_context(state: State) -> AppContext:
    """The app's context (set while the app runs: its lifespan built it)."""
    context = state[KEY]
    assert isinstance(context, AppContext)
    return context
