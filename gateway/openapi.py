"""OpenAPI for /v1/embeddings, whose body is read by hand (two content types on one route)."""

from __future__ import annotations

from dataclasses import dataclass

from litestar.openapi.spec import (
    OpenAPIFormat,
    OpenAPIHeader,
    OpenAPIMediaType,
    OpenAPIResponse,
    OpenAPIType,
    Operation,
    RequestBody,
    Schema,
)

from gateway.responses import BINARY_MEDIA_TYPE

PROBLEM_MEDIA_TYPE = "application/problem+json"

_string = Schema(type=OpenAPIType.STRING)
_image_string = Schema(
    type=OpenAPIType.STRING,
    description="An image (JPEG, PNG or WebP) as base64, or as a data: URI with base64 payload.",
    min_length=1,
)

EMBEDDING_REQUEST = Schema(
    type=OpenAPIType.OBJECT,
    required=["input"],
    properties={
        "input": Schema(
            one_of=[_image_string, Schema(type=OpenAPIType.ARRAY, items=_image_string, min_items=1)]
        ),
        "model": Schema(type=OpenAPIType.STRING, description="Served model id or an alias."),
        "encoding_format": Schema(
            type=OpenAPIType.STRING,
            enum=["float", "base64"],
            default="float",
            description="base64: little-endian float32 bytes, as OpenAI sends them.",
        ),
        "normalize": Schema(
            type=OpenAPIType.BOOLEAN, default=True, description="false: raw, not unit-length."
        ),
        "dimensions": Schema(type=OpenAPIType.INTEGER, description="Ignored (OpenAI compat)."),
        "user": _string,
    },
)

MULTIPART_REQUEST = Schema(
    type=OpenAPIType.OBJECT,
    description=(
        "Every part that is not an option field is an image (JPEG, PNG or WebP), in order, "
        "whatever its field name."
    ),
    properties={
        "image": Schema(
            type=OpenAPIType.ARRAY,
            items=Schema(type=OpenAPIType.STRING, format="binary"),  # type: ignore[arg-type]
        ),
        "model": _string,
        "encoding_format": Schema(type=OpenAPIType.STRING, enum=["float", "base64"]),
        "normalize": Schema(type=OpenAPIType.STRING, enum=["true", "false"]),
    },
)

EMBEDDING_RESPONSE = Schema(
    type=OpenAPIType.OBJECT,
    required=["object", "data", "model", "usage"],
    properties={
        "object": Schema(type=OpenAPIType.STRING, const="list"),
        "model": _string,
        "data": Schema(
            type=OpenAPIType.ARRAY,
            items=Schema(
                type=OpenAPIType.OBJECT,
                required=["object", "index", "embedding"],
                properties={
                    "object": Schema(type=OpenAPIType.STRING, const="embedding"),
                    "index": Schema(type=OpenAPIType.INTEGER),
                    "embedding": Schema(
                        one_of=[
                            Schema(type=OpenAPIType.ARRAY, items=Schema(type=OpenAPIType.NUMBER)),
                            Schema(type=OpenAPIType.STRING, description="base64 float32 LE"),
                        ]
                    ),
                },
            ),
        ),
        "usage": Schema(
            type=OpenAPIType.OBJECT,
            properties={
                "prompt_tokens": Schema(type=OpenAPIType.INTEGER),
                "total_tokens": Schema(type=OpenAPIType.INTEGER),
                "images": Schema(type=OpenAPIType.INTEGER),
            },
        ),
    },
)

PROBLEM = Schema(
    type=OpenAPIType.OBJECT,
    description="RFC 9457 problem details; `index` names the offending image when there is one.",
    properties={
        "type": _string,
        "title": _string,
        "status": Schema(type=OpenAPIType.INTEGER),
        "detail": _string,
        "index": Schema(type=OpenAPIType.INTEGER),
    },
)

_ERRORS = {
    "400": "Malformed body (JSON, multipart, base64 options) or no images",
    "401": "Missing or wrong API key (when keys are configured)",
    "404": "Unknown model",
    "408": "The request body did not arrive within GATEWAY_BODY_TIMEOUT_S",
    "413": "Body, image or image count over its limit",
    "415": "Unsupported content type or image format",
    "422": "An image that cannot be decoded, or has too many pixels; or a schema mismatch",
    "429": "Too many images in flight (Retry-After)",
    "499": "The client closed the connection; its work was cancelled (logged, never read)",
    "502": "Triton failed",
    "503": "Triton unavailable or shedding load (Retry-After)",
    "504": "Triton did not answer before the deadline",
}


def problem_response(description: str) -> OpenAPIResponse:
    return OpenAPIResponse(
        description=description,
        content={PROBLEM_MEDIA_TYPE: OpenAPIMediaType(schema=PROBLEM)},
    )


@dataclass
class EmbeddingsOperation(Operation):
    """Replaces what Litestar infers from a raw-Request handler with the real contract."""

    def __post_init__(self) -> None:
        self.request_body = RequestBody(
            required=True,
            content={
                "application/json": OpenAPIMediaType(schema=EMBEDDING_REQUEST),
                "multipart/form-data": OpenAPIMediaType(schema=MULTIPART_REQUEST),
            },
        )
        self.responses = {
            "200": OpenAPIResponse(
                description=(
                    "Embeddings, unit-length unless normalize=false. JSON by default; with "
                    f"`Accept: {BINARY_MEDIA_TYPE}`, raw little-endian [n, D] floats."
                ),
                content={
                    "application/json": OpenAPIMediaType(schema=EMBEDDING_RESPONSE),
                    BINARY_MEDIA_TYPE: OpenAPIMediaType(
                        schema=Schema(type=OpenAPIType.STRING, format=OpenAPIFormat.BINARY)
                    ),
                },
                headers={
                    "X-Embedding-Shape": OpenAPIHeader(
                        schema=_string, description="n,D (binary only)"
                    ),
                    "X-Embedding-Dtype": OpenAPIHeader(
                        schema=_string, description="float32|float16"
                    ),
                    "Server-Timing": OpenAPIHeader(
                        schema=_string, description="decode and infer durations (ms)"
                    ),
                },
            ),
            **{status: problem_response(text) for status, text in _ERRORS.items()},
        }
