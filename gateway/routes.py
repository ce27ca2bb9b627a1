"""HTTP routes: parse, call the service, serialise. Errors go to the problem-details plugin."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Annotated, Any, Literal, TypeVar

import httpx
from litestar import Request, Response, get, post
from litestar.datastructures import State
from litestar.exceptions import NotFoundException
from litestar.params import QueryParameter
from opentelemetry.trace import Tracer

from gateway import parsing, responses
from gateway.auth import PUBLIC
from gateway.canary import Canary
from gateway.errors import (
    BackendUnavailable,
    ClientClosedRequest,
    InvalidRequest,
    RequestTimeout,
    UnknownModel,
    UnsupportedMediaType,
)
from gateway.openapi import EmbeddingsOperation
from gateway.service import Embeddings, EmbeddingService
from gateway.settings import GatewaySettings

JSON = "application/json"
T = TypeVar("T")


async def read_request(
    request: Request[Any, Any, Any], settings: GatewaySettings
) -> parsing.ParsedRequest:
    media_type, options = request.content_type
    if media_type == "multipart/form-data":
        if not options.get("boundary"):
            raise InvalidRequest("multipart/form-data without a boundary parameter")
        return await parsing.parse_multipart(
            request.stream(),
            options["boundary"],
            max_images=settings.max_images_per_request,
            max_image_bytes=settings.max_image_bytes,
        )
    if media_type == JSON:
        return parsing.parse_json(await request.body(), settings.max_images_per_request)
    raise UnsupportedMediaType(
        f"Content-Type {media_type or '(none)'} is not accepted; send multipart/form-data "
        "with image parts, or application/json in the OpenAI embeddings shape"
    )


@post(
    "/v1/embeddings",
    operation_class=EmbeddingsOperation,
    summary="Embed images",
    tags=["embeddings"],
    status_code=200,
)
async def create_embeddings(
    request: Request[Any, Any, Any],
    state: State,
    dtype: Annotated[
        Literal["float32", "float16"],
        QueryParameter(description="Element type of the binary (octet-stream) response."),
    ] = "float32",
    normalize: Annotated[
        bool | None, QueryParameter(description="false: raw, not unit-length, embeddings.")
    ] = None,
    skip_invalid: Annotated[
        bool | None,
        QueryParameter(description="true: embed the good images, list the bad in `errors`."),
    ] = None,
) -> Response[bytes]:
    """Embed a batch of images given as multipart parts or base64 strings in OpenAI's JSON shape.

    Query parameters apply to both forms; a body or form field of the same name wins.
    """
    settings: GatewaySettings = state.settings
    service: EmbeddingService = state.service
    tracer: Tracer = state.telemetry.tracer
    with tracer.start_as_current_span("receive") as span:
        try:
            async with asyncio.timeout(settings.body_timeout_s):
                parsed = await read_request(request, settings)
        except TimeoutError as exc:
            raise RequestTimeout(
                f"request body not received within {settings.body_timeout_s:g} s"
            ) from exc
        span.set_attributes(
            {"images": len(parsed.items), "http.request.body.size": request.content_length or 0}
        )
    request.state.images = len(parsed.items)
    if not settings.accepts_model(parsed.model):
        raise UnknownModel(f"model {parsed.model!r} is not served here; use {settings.model_id!r}")
    unit = _first(parsed.normalize, normalize, True)
    skip = _first(parsed.skip_invalid, skip_invalid, False)
    result = await unless_disconnected(
        request, service.embed(parsed.items, normalize=unit, skip_invalid=skip)
    )
    return encode(request, tracer, settings, result, parsed, dtype, skip)


def encode(
    request: Request[Any, Any, Any],
    tracer: Tracer,
    settings: GatewaySettings,
    result: Embeddings,
    parsed: parsing.ParsedRequest,
    dtype: Literal["float32", "float16"],
    skip: bool,
) -> Response[bytes]:
    timing = {"Server-Timing": responses.server_timing(result)}
    binary = request.accept.best_match([JSON, responses.BINARY_MEDIA_TYPE], JSON) != JSON
    with tracer.start_as_current_span("encode", attributes={"binary": binary}):
        if not binary:
            body = responses.openai_json(
                result.vectors,
                settings.model_id,
                parsed.encoding_format or "float",
                indices=result.indices,
                errors=result.errors if skip else None,
            )
            return Response(body, media_type=JSON, headers=timing)
        raw, headers = responses.binary(
            result.vectors,
            dtype,
            indices=result.indices if skip else None,
            failed=[int(e.index or 0) for e in result.errors] if skip else None,
        )
        return Response(raw, media_type=responses.BINARY_MEDIA_TYPE, headers=headers | timing)


def _first(*values: bool | None) -> bool:
    return next(v for v in values if v is not None)


async def unless_disconnected(request: Request[Any, Any, Any], work: Awaitable[T]) -> T:
    """Run ``work``; if the client disconnects first, cancel it (queued decodes, the gRPC call)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task  # let it unwind: admission budget released, gRPC call cancelled
    raise ClientClosedRequest("client disconnected; its pending work was cancelled")


async def _disconnected(request: Request[Any, Any, Any]) -> None:
    # The body has been read: the next ASGI message is the disconnect (or never comes).
    while (await request.receive())["type"] != "http.disconnect":
        pass


@get(
    "/healthz",
    tags=["health"],
    summary="Liveness: the process answers (never calls Triton)",
    opt={PUBLIC: True},
    security=[{}],
)
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@get(
    "/readyz",
    tags=["health"],
    summary="Readiness: model READY in Triton and the canary passes",
    opt={PUBLIC: True},
    security=[{}],
)
async def readyz(state: State) -> dict[str, str]:
    service: EmbeddingService = state.service
    canary: Canary = state.canary
    if not await service.ready():
        raise BackendUnavailable("model is not ready")
    if not canary.healthy():
        detail = canary.last.detail if canary.last else "canary has not run yet"
        raise BackendUnavailable(f"canary check failing: {detail}")
    return {"status": "ready", "canary": canary.last.detail if canary.last else "disabled"}


@get(
    "/v1/models",
    tags=["models"],
    summary="The served model (OpenAI list shape)",
)
async def list_models(state: State) -> dict[str, Any]:
    settings: GatewaySettings = state.settings
    service: EmbeddingService = state.service
    entry: dict[str, Any] = {
        "id": settings.model_id,
        "object": "model",
        "created": 0,
        "owned_by": "clip-gateway",
        "aliases": list(settings.model_aliases),
    }
    try:
        info = await service.model_info()
    except BackendUnavailable:
        entry["ready"] = False
    else:
        entry.update(ready=True, embed_dim=info.embed_dim, image_size=info.image_size)
    return {"object": "list", "data": [entry]}


@get(
    "/metrics",
    tags=["observability"],
    summary="Prometheus metrics (OpenMetrics with trace exemplars when asked for)",
    media_type="text/plain",
)
async def metrics(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    openmetrics = "application/openmetrics-text" in (request.headers.get("accept") or "")
    body, content_type = state.metrics.render(openmetrics)
    return Response(body, headers={"Content-Type": content_type})


@get(
    "/metrics/triton",
    tags=["observability"],
    summary="Triton's own Prometheus metrics, re-exposed from its loopback port",
    media_type="text/plain",
)
async def triton_metrics(state: State) -> Response[bytes]:
    settings: GatewaySettings = state.settings
    if not settings.triton_metrics_url:
        raise NotFoundException("GATEWAY_TRITON_METRICS_URL is not set")
    try:
        upstream = await state.http.get(settings.triton_metrics_url)
    except httpx.HTTPError as exc:
        raise BackendUnavailable(f"Triton metrics unreachable: {exc}") from exc
    return Response(
        upstream.content,
        status_code=upstream.status_code,
        headers={"Content-Type": upstream.headers.get("content-type", "text/plain")},
    )


ROUTES = [create_embeddings, healthz, readyz, list_models, metrics, triton_metrics]
