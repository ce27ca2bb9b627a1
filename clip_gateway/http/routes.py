"""HTTP routes: parse, call the pipeline, serialise. No try/except: errors raised anywhere
below go to the one error map (http/problems.py)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Annotated, Any

import httpx
import msgspec
from litestar import Request, Response, get, post
from litestar.datastructures import State
from litestar.exceptions import NotFoundException
from litestar.params import QueryParameter
from opentelemetry.trace import Tracer

from clip_gateway.config.settings import ServerSettings
from clip_gateway.errors import (
    BackendUnavailable,
    MalformedRequest,
    UnknownModel,
    UnsupportedFormat,
)
from clip_gateway.http import encoding, parsing
from clip_gateway.http.auth import PUBLIC
from clip_gateway.http.body import admitted, read_all, read_request, unless_disconnected
from clip_gateway.http.context import app_context
from clip_gateway.http.docs import PROTECTED, EmbeddingsOperation
from clip_gateway.http.schemas import (
    BinaryDtype,
    Health,
    ImagingPath,
    ModelCard,
    ModelList,
    PreprocessingCard,
    TextTokenizer,
)
from clip_gateway.http.urls import items as url_items
from clip_gateway.http.urls.fetch import fetcher_of
from clip_gateway.pipeline.admission import Reservation
from clip_gateway.pipeline.items import ImageItem, TextItem
from clip_gateway.pipeline.service import Embeddings, EmbeddingService

JSON = encoding.JSON_MEDIA_TYPE


async def parse_body(
    content_type: tuple[str, dict[str, str]],
    chunks: AsyncIterator[bytes],
    settings: ServerSettings,
    reservation: Reservation,
) -> parsing.ParsedRequest:
    """/v1/embeddings' body by its content type: a form streamed, or OpenAI's JSON read whole;
    each item added to the reservation as soon as it is in (a URL item once fetched)."""
    media_type, options = content_type
    if media_type == "multipart/form-data":
        if not options.get("boundary"):
            raise MalformedRequest("multipart/form-data without a boundary parameter")
        return await parsing.parse_multipart(
            chunks,
            options["boundary"],
            max_items=settings.max_items_per_request,
            max_image_bytes=settings.max_image_bytes,
            max_text_chars=settings.max_text_chars,
            on_item=reservation.add,
        )
    if media_type == JSON:
        body = await read_all(chunks)
        parsed = parsing.parse_json(body, settings.max_items_per_request, settings.max_image_bytes)
        for item in parsed.items:
            if not (isinstance(item, ImageItem) and item.url):  # priced once fetched
                reservation.add(item)
        return parsed
    raise UnsupportedFormat(
        f"Content-Type {media_type or '(none)'} is not accepted; send multipart/form-data "
        "with image parts, or application/json in the OpenAI embeddings shape"
    )


@post(
    "/v1/embeddings",
    operation_class=EmbeddingsOperation,
    summary="Embed images and texts",
    tags=["embeddings"],
    status_code=200,
    responses=PROTECTED,
)
async def create_embeddings(
    request: Request[Any, Any, Any],
    state: State,
    dtype: Annotated[
        BinaryDtype,
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
    """Embed a batch of images and texts, into one space, answered in request order: multipart
    (image files, ``text`` fields) or OpenAI's JSON shape (texts as strings, images as
    ``data:image/...;base64,`` URIs, or either as ``{"text": ...}`` / ``{"image": ...}``).

    Query parameters apply to both forms; a body or form field of the same name wins.
    """
    context = app_context(state)
    settings, pipeline, tracer = context.settings, context.pipeline, context.telemetry.tracer
    declared = request.content_length
    with admitted(request, context, "open_clip") as reservation:
        with tracer.start_as_current_span("receive") as span:
            parsed = await read_request(request, settings, reservation, parse_body)
            # one deadline from here: URL items' fetches and the embedding together
            deadline = asyncio.get_running_loop().time() + settings.request_timeout_s
            window = url_items.fetch_window(settings.request_timeout_s, settings.horizon_s)
            skip = _first(parsed.skip_invalid, skip_invalid, False)
            items = parsed.items
            await check_request(pipeline, settings, parsed)
            if url_items.has_urls(items):  # what else needs no network, before any
                fetcher = url_items.fetcher_for(items, fetcher_of(state))
                if not skip:
                    await pipeline.check_texts(items)
                items = await url_items.fetch_items(
                    items, fetcher, reservation, skip=skip, window_s=window
                )
            texts = sum(isinstance(item, TextItem) for item in parsed.items)
            span.set_attributes(
                {
                    "images": len(parsed.items) - texts,
                    "texts": texts,
                    "http.request.body.size": declared or 0,
                }
            )
        request.state.images, request.state.texts = len(parsed.items) - texts, texts
        unit = _first(parsed.normalize, normalize, True)
        left = deadline - asyncio.get_running_loop().time()
        embedding = pipeline.embed(reservation, items, normalize=unit, skip_invalid=skip,
                                   timeout_s=left)  # fmt: skip
        result = await unless_disconnected(request, embedding)
        return embeddings_response(request, tracer, settings, result, parsed, dtype, skip)


async def check_request(
    pipeline: EmbeddingService, settings: ServerSettings, parsed: parsing.ParsedRequest
) -> None:
    """The request's options, refused before any work: the model and ``dimensions``."""
    if not settings.accepts_model(parsed.model):
        raise UnknownModel(f"model {parsed.model!r} is not served here; use {settings.model_id!r}")
    if parsed.dimensions is not None:
        await check_dimensions(pipeline, settings.model_id, parsed.dimensions)


async def check_dimensions(pipeline: EmbeddingService, model_id: str, asked: int) -> None:
    """OpenAI's ``dimensions``: only the model's own (no CLIP model declares a truncated
    embedding meaningful); anything else is refused, naming the parameter and the model."""
    embed_dim = (await pipeline.capabilities()).model.embed_dim
    if asked != embed_dim:
        raise MalformedRequest(
            f"dimensions={asked} is not supported by model {model_id!r}: its embeddings have "
            f"{embed_dim} dimensions and it does not declare truncated ones meaningful; "
            f"omit dimensions or send {embed_dim}"
        )


def embeddings_response(
    request: Request[Any, Any, Any],
    tracer: Tracer,
    settings: ServerSettings,
    result: Embeddings,
    parsed: parsing.ParsedRequest,
    dtype: BinaryDtype,
    skip: bool,
) -> Response[bytes]:
    """``result`` as the client asked (``Accept``): OpenAI's JSON or raw floats."""
    timing = {"Server-Timing": encoding.server_timing(result)}
    binary = request.accept.best_match([JSON, encoding.BINARY_MEDIA_TYPE], JSON) != JSON
    with tracer.start_as_current_span("encode", attributes={"binary": binary}):
        if not binary:
            body = encoding.openai_json(
                result.vectors,
                settings.model_id,
                parsed.encoding_format or "float",
                indices=result.indices,
                errors=result.errors if skip else None,
                usage=encoding.usage(result),
            )
            return Response(body, media_type=JSON, headers=timing)
        raw, headers = encoding.binary(
            result.vectors,
            dtype,
            indices=result.indices if skip else None,
            failed=[int(e.index or 0) for e in result.errors] if skip else None,
        )
        return Response(raw, media_type=encoding.BINARY_MEDIA_TYPE, headers=headers | timing)


def _first(*values: bool | None) -> bool:
    return next(v for v in values if v is not None)


@get(
    "/healthz",
    tags=["health"],
    summary="Liveness: the process answers (never calls Triton)",
    opt={PUBLIC: True},
    security=[{}],
)
async def healthz() -> Health:
    return Health("ok")


@get(
    "/readyz",
    tags=["health"],
    summary="Readiness: model READY in Triton, the canary passes, every worker accepts",
    opt={PUBLIC: True},
    security=[{}],
    responses={503: PROTECTED[503]},
)
async def readyz(state: State) -> Health:
    context = app_context(state)
    canary = context.canary
    if not await context.pipeline.ready():
        raise BackendUnavailable("model is not ready")
    if context.workers_accepting is not None:  # a connection made now stays where it lands
        accepting, planned = context.workers_accepting()
        if accepting < planned:
            raise BackendUnavailable(
                f"{accepting} of the gateway's {planned} workers accept connections"
            )
    if not canary.healthy():
        detail = canary.last.detail if canary.last else "canary has not run yet"
        raise BackendUnavailable(f"canary check failing: {detail}")
    return Health("ready", canary.last.detail if canary.last else "disabled")


@get(
    "/v1/models",
    tags=["models"],
    summary="The served model: modalities, dimension, context length, preprocessing",
    responses={401: PROTECTED[401]},
)
async def list_models(state: State) -> ModelList:
    context = app_context(state)
    settings = context.settings
    card = ModelCard(
        id=settings.model_id,
        object="model",
        created=0,
        owned_by="clip-gateway",
        aliases=list(settings.model_aliases),
        ready=False,
        imaging=ImagingPath(**dataclasses.asdict(context.imaging)),
        immich_names=list(settings.immich_names) if settings.immich else msgspec.UNSET,
    )
    try:
        capabilities = await context.pipeline.capabilities()
    except BackendUnavailable:
        return ModelList("list", [card])
    model, text = capabilities.model, capabilities.text
    pre = model.image_preprocessing
    preprocessing = PreprocessingCard(
        size=pre.size,
        resize_mode=pre.resize_mode,
        interpolation=pre.interpolation,
        center_crop=pre.resize_mode != "squash",
        fill_color=list(pre.fill_color) if pre.resize_mode == "longest" else msgspec.UNSET,
        mean=list(pre.mean) if pre.mean else msgspec.UNSET,
        std=list(pre.std) if pre.std else msgspec.UNSET,
        from_tag=pre.from_tag or msgspec.UNSET,
    )
    tokenizer: TextTokenizer | msgspec.UnsetType = msgspec.UNSET
    text_unavailable: str | msgspec.UnsetType = msgspec.UNSET
    if capabilities.text_unavailable is not None:
        text_unavailable = capabilities.text_unavailable
    if text is not None:
        tokenizer = TextTokenizer(
            kind=text.tokenizer_kind,
            context_length=text.context_length,
            clean=text.clean,
            pooling=text.pooling or msgspec.UNSET,
        )
    ready = msgspec.structs.replace(
        card,
        ready=True,
        modalities=list(capabilities.modalities),
        embed_dim=model.embed_dim,
        dimensions=[model.embed_dim],
        image_size=model.image_size,
        # the served text model's, even when its tokenizer does not load here
        context_length=msgspec.UNSET if model.text is None else model.text.context_length,
        tokenizer=tokenizer,
        preprocessing=preprocessing,
        text_unavailable=text_unavailable,
        quantization=model.quantization if model.quantization is not None else msgspec.UNSET,
    )
    return ModelList("list", [ready])


@get(
    "/metrics",
    tags=["observability"],
    summary="Prometheus metrics (OpenMetrics with trace exemplars when asked for)",
    media_type="text/plain",
    responses={401: PROTECTED[401]},
)
async def metrics(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    openmetrics = "application/openmetrics-text" in (request.headers.get("accept") or "")
    body, content_type = app_context(state).metrics.render(openmetrics)
    return Response(body, headers={"Content-Type": content_type})


@get(
    "/metrics/triton",
    tags=["observability"],
    summary="Triton's own Prometheus metrics, re-exposed from its loopback port",
    media_type="text/plain",
    responses={401: PROTECTED[401], 404: PROTECTED[404], 503: PROTECTED[503]},
)
async def triton_metrics(state: State) -> Response[bytes]:
    context = app_context(state)
    settings = context.settings
    if not settings.triton_metrics_url:
        raise NotFoundException("GATEWAY_TRITON_METRICS_URL is not set")
    try:
        upstream = await context.http.get(settings.triton_metrics_url)
    except httpx.HTTPError as exc:
        raise BackendUnavailable(f"Triton metrics unreachable: {exc}") from exc
    return Response(
        upstream.content,
        status_code=upstream.status_code,
        headers={"Content-Type": upstream.headers.get("content-type", "text/plain")},
    )


ROUTES = [create_embeddings, healthz, readyz, list_models, metrics, triton_metrics]
