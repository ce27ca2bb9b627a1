"""Immich's machine-learning protocol (``GATEWAY_IMMICH``; docs/IMMICH.md): ``GET /ping``,
``GET /`` and ``POST /predict`` as Immich's server calls them (``immich_ml/main.py``,
``machine-learning.repository.ts``), on the same admission, pipeline, batching, metrics and
error map as ``/v1/embeddings``. Answers keep Immich's shapes; statuses come from the map:
malformed ``entries`` 422, neither image nor text 400, faces/OCR/several tasks 501, a model
name not served 409, so Immich's server tries the next URL in its list and never stores
another model's vector. With an upstream (http/immich/passthrough.py) every ``/predict`` but
one CLIP encoding of a served model goes there instead, unchanged.
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import MediaType, Request, Response, get, post
from litestar.datastructures import State

from clip_gateway.config.settings import ServerSettings
from clip_gateway.http.auth import PUBLIC
from clip_gateway.http.body import admitted, read_request, unless_disconnected
from clip_gateway.http.context import AppContext, app_context
from clip_gateway.http.encoding import JSON_MEDIA_TYPE
from clip_gateway.http.immich.form import check_form, read_predict
from clip_gateway.http.immich.passthrough import elsewhere, upstream_of
from clip_gateway.pipeline.items import TextItem


@get("/", include_in_schema=False, opt={PUBLIC: True}, security=[{}])
async def immich_root() -> dict[str, str]:
    """What Immich's ML server answers at its root."""
    return {"message": "Immich ML"}


@get("/ping", media_type=MediaType.TEXT, include_in_schema=False, opt={PUBLIC: True},
     security=[{}])  # fmt: skip
async def immich_ping() -> str:
    """Immich's availability probe (2 s timeout): the process answers; never calls Triton, so a
    busy GPU does not make Immich mark this URL unhealthy."""
    return "pong"


@post("/predict", include_in_schema=False, status_code=200)
async def immich_predict(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    """One CLIP encoding, Immich's way: an ``entries`` form field naming the task, and an
    ``image`` part (a preview, JPEG or WebP, found by content) or a ``text`` field; with an
    upstream, anything else is forwarded there."""
    context = app_context(state)
    upstream = upstream_of(state)
    if upstream is not None:
        relayed = await elsewhere(request, context.settings, upstream)
        if relayed is not None:
            return relayed
    return await serve(request, context)


async def serve(request: Request[Any, Any, Any], context: AppContext) -> Response[bytes]:
    settings, pipeline = context.settings, context.pipeline
    # the same admission as /v1/embeddings: bodies counted as they arrive, images priced by the
    # decode work their headers promise, each API key within its share; Immich's preprocessing
    with admitted(request, context, "immich") as reservation:
        with context.telemetry.tracer.start_as_current_span("receive"):
            form = await read_request(request, settings, reservation, read_predict)
        kind, item = check_form(form, settings)
        is_text = isinstance(item, TextItem)
        request.state.images, request.state.texts = int(not is_text), int(is_text)
        result = await unless_disconnected(request, pipeline.embed(reservation, [item]))
    body: dict[str, Any] = {"clip": msgspec.json.encode(result.vectors[0].tolist()).decode()}
    if kind == "visual":  # decoded, or answered from the cache with the size it had then
        width, height = result.image_sizes[0]
        body["imageHeight"], body["imageWidth"] = height, width
    return Response(msgspec.json.encode(body), media_type=JSON_MEDIA_TYPE)


@get("/immich/upstream", include_in_schema=False)
async def immich_upstream(state: State) -> dict[str, Any]:
    """Each configured upstream as its ``/ping`` answers now: ``up`` or ``down`` and why (in
    fixed words: never an address beyond the configured URL)."""
    upstream = upstream_of(state)
    assert upstream is not None  # the route exists only with one
    await upstream.ping_all()
    return {
        "upstreams": [
            {"url": s.url, "state": s.state, **({"detail": s.detail} if s.detail else {})}
            for s in upstream.states
        ],
        "forwards_in_flight": upstream.in_flight,
    }


ROUTES = [immich_root, immich_ping, immich_predict]


def routes(settings: ServerSettings) -> list[Any]:
    """Immich's routes, and the upstream's status route when one is configured."""
    return [*ROUTES, immich_upstream] if settings.immich_upstream else ROUTES
