"""What every route works with, in one typed object on ``app.state``: the settings, the
pipeline, its canary, telemetry, metrics, the API keys and the client for Triton's metrics.
Built once per worker by the lifespan (http/app.py); handlers fetch it with ``app_context``.
Immich's upstream client (http/immich/passthrough.py) and URL items' fetcher
(http/urls/fetch.py) sit beside it on ``app.state``, each its own room's, so this shared
context imports neither room."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import httpx
from litestar.datastructures import State

from clip_gateway.config.settings import ServerSettings
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
    #: Several workers: how many accept connections, of those planned (http/spread.py).
    workers_accepting: Callable[[], tuple[int, int]] | None = None


#: The key of the context on ``app.state``.
KEY = "context"


def app_context(state: State) -> AppContext:
    """The app's context (set while the app runs: its lifespan built it)."""
    context = state[KEY]
    assert isinstance(context, AppContext)
    return context
