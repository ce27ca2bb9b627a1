"""HTTP routes: parse, call the service, serialise. Errors go to the problem-details plugin."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from litestar import Request, Response, get, post
from litestar.datastructures import State
from litestar.params import QueryParameter

from gateway import parsing, responses
from gateway.errors import BackendUnavailable, InvalidRequest, UnknownModel, UnsupportedMediaType
from gateway.openapi import EmbeddingsOperation
from gateway.service import EmbeddingService
from gateway.settings import GatewaySettings

JSON = "application/json"


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
) -> Response[bytes]:
    """Embed a batch of images given as multipart parts or base64 strings in OpenAI's JSON shape.

    Query parameters apply to both forms; ``normalize`` in the body or form wins over the query.
    ``dtype`` chooses the element type of the binary response.
    """
    settings: GatewaySettings = state.settings
    service: EmbeddingService = state.service
    parsed = await read_request(request, settings)
    if not settings.accepts_model(parsed.model):
        raise UnknownModel(f"model {parsed.model!r} is not served here; use {settings.model_id!r}")
    unit = parsed.normalize if parsed.normalize is not None else normalize is not False
    result = await service.embed(parsed.items, normalize=unit)
    timing = {"Server-Timing": responses.server_timing(result)}
    if request.accept.best_match([JSON, responses.BINARY_MEDIA_TYPE], JSON) == JSON:
        body = responses.openai_json(
            result.vectors, settings.model_id, parsed.encoding_format or "float"
        )
        return Response(body, media_type=JSON, headers=timing)
    raw, headers = responses.binary(result.vectors, dtype)
    return Response(raw, media_type=responses.BINARY_MEDIA_TYPE, headers=headers | timing)


@get("/healthz", tags=["health"], summary="Liveness: the process answers (never calls Triton)")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@get("/readyz", tags=["health"], summary="Readiness: the model is READY in Triton")
async def readyz(state: State) -> dict[str, str]:
    service: EmbeddingService = state.service
    if not await service.ready():
        raise BackendUnavailable("model is not ready")
    return {"status": "ready"}


@get("/v1/models", tags=["models"], summary="The served model (OpenAI list shape)")
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


ROUTES = [create_embeddings, healthz, readyz, list_models]
