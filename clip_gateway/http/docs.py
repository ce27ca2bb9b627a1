"""The OpenAPI document and /docs, generated from the request/response types (http/schemas.py)
and the error map (http/problems.py), so neither can drift from what the server does.

/docs is Swagger UI 5 (it reads OpenAPI 3.1; version 4 could not) from the files the
``flask-swagger-ui`` package ships, served by this server: no CDN, it works offline.
"""

from __future__ import annotations

import importlib.util
from collections import defaultdict
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, cast

import msgspec
from litestar import Router
from litestar.openapi import OpenAPIConfig, ResponseSpec
from litestar.openapi.plugins import SwaggerRenderPlugin
from litestar.openapi.spec import (
    Components,
    OpenAPIFormat,
    OpenAPIHeader,
    OpenAPIMediaType,
    OpenAPIResponse,
    OpenAPIType,
    Operation,
    Reference,
    RequestBody,
    Schema,
    SecurityScheme,
)
from litestar.static_files import create_static_files_router

from clip_gateway import __version__
from clip_gateway.http.problems import PROBLEM_MEDIA_TYPE, PROBLEMS
from clip_gateway.http.schemas import (
    FORM_OPTIONS,
    EmbeddingRequest,
    EmbeddingResponse,
    Problem,
)

BINARY = "application/octet-stream"
ASSETS = "/docs/assets"


def json_schema(kind: type) -> dict[str, Any]:
    """JSON Schema of a msgspec type with its definitions inlined (OpenAPI 3.1 schema object)."""
    generated = msgspec.json.schema(kind)
    definitions = generated.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref.startswith("#/$defs/"):
                return inline(definitions[ref.removeprefix("#/$defs/")])
            return {key: inline(value) for key, value in node.items()}
        if isinstance(node, list):
            return [inline(value) for value in node]
        return node

    return cast(dict[str, Any], inline(generated))


def _form_schema() -> dict[str, Any]:
    """The multipart form: the JSON request's options as fields, ``text`` fields texts, every
    other part an image."""
    options = json_schema(EmbeddingRequest)["properties"]
    fields: dict[str, Any] = {
        "image": {
            "type": "array",
            "items": {"type": "string", "format": "binary"},
            "description": (
                "Images (JPEG, PNG, WebP or GIF), any field name but the options and `text`; "
                "kept in arrival order with the texts."
            ),
        },
        "text": {
            "type": "array",
            "items": {"type": "string"},
            "description": "Texts to embed into the same space, in arrival order with the images.",
        },
    }
    for name in FORM_OPTIONS:
        option = options[name]
        if name in ("normalize", "skip_invalid"):
            option = {"type": "string", "enum": ["true", "false"]}
        fields[name] = option
    return {"type": "object", "properties": fields}


def _problem_responses() -> dict[str, OpenAPIResponse]:
    """One response per status in the error map, titled by every error kind that has it (not
    499, which nobody reads: the client has gone; not 500, which is never raised on purpose)."""
    titles: dict[int, list[str]] = defaultdict(list)
    for problem in PROBLEMS.values():
        if problem.status not in (499, 500):
            titles[problem.status].append(problem.title)
    return {str(status): problem_response(status, "; ".join(t)) for status, t in titles.items()}


def problem_response(status: int, description: str) -> OpenAPIResponse:
    headers: dict[str, OpenAPIHeader | Reference] = {}
    if status in (429, 503):
        headers["Retry-After"] = OpenAPIHeader(
            schema=Schema(type=OpenAPIType.INTEGER),
            description="Seconds before trying again",
        )
    if status == 401:
        headers["WWW-Authenticate"] = OpenAPIHeader(schema=Schema(type=OpenAPIType.STRING))
    return OpenAPIResponse(
        description=description,
        content={PROBLEM_MEDIA_TYPE: OpenAPIMediaType(schema=_schema(Problem))},
        headers=headers or None,
    )


@cache
def _schema(kind: type) -> Schema:
    return cast(Schema, json_schema(kind))  # a plain dict: Litestar renders dicts as they are


def _string_header(description: str) -> OpenAPIHeader:
    return OpenAPIHeader(schema=Schema(type=OpenAPIType.STRING), description=description)


@dataclass
class EmbeddingsOperation(Operation):
    """/v1/embeddings reads its body by hand (JSON or streamed multipart on one route), so its
    operation is built here from the same types the handler decodes and encodes."""

    def __post_init__(self) -> None:
        self.request_body = RequestBody(
            required=True,
            content={
                "application/json": OpenAPIMediaType(schema=_schema(EmbeddingRequest)),
                "multipart/form-data": OpenAPIMediaType(schema=cast(Schema, _form_schema())),
            },
        )
        ok = OpenAPIResponse(
            description=(
                "Embeddings, unit length unless normalize=false. JSON by default; with "
                f"`Accept: {BINARY}`, raw little-endian [n, D] floats."
            ),
            content={
                "application/json": OpenAPIMediaType(schema=_schema(EmbeddingResponse)),
                BINARY: OpenAPIMediaType(
                    schema=Schema(type=OpenAPIType.STRING, format=OpenAPIFormat.BINARY)
                ),
            },
            headers={
                "Server-Timing": _string_header("decode and infer durations (ms)"),
                "X-Embedding-Shape": _string_header("n,D (binary responses)"),
                "X-Embedding-Dtype": _string_header("float32 | float16 (binary responses)"),
                "X-Embedding-Indices": _string_header(
                    "request position of each row (binary, skip_invalid)"
                ),
                "X-Embedding-Failed": _string_header(
                    "positions that could not be embedded (binary, skip_invalid)"
                ),
            },
        )
        self.responses = {"200": ok, **_problem_responses()}


def _spec(status: int) -> ResponseSpec:
    titles = "; ".join(p.title for p in PROBLEMS.values() if p.status == status)
    return ResponseSpec(
        data_container=Problem,
        description=titles,
        media_type=PROBLEM_MEDIA_TYPE,
        generate_examples=False,
    )


#: Error responses of the other routes, from the same map.
PROTECTED: dict[int, ResponseSpec] = {status: _spec(status) for status in (401, 404, 503)}


def openapi_config(keys_configured: bool) -> OpenAPIConfig:
    """Security is declared only when keys are configured: the document says what this server
    does. Swagger UI's assets come from this server, never from a CDN."""
    return OpenAPIConfig(
        title="CLIP gateway",
        version=__version__,
        description="CLIP embeddings from compact image batches; OpenAI-compatible.",
        path="/docs",
        render_plugins=[
            SwaggerRenderPlugin(
                js_url=f"{ASSETS}/swagger-ui-bundle.js",
                css_url=f"{ASSETS}/swagger-ui.css",
                standalone_preset_js_url=f"{ASSETS}/swagger-ui-standalone-preset.js",
                favicon=f"<link rel='icon' type='image/png' href='{ASSETS}/favicon-32x32.png'>",
                path="/",
            )
        ],
        components=Components(
            security_schemes={
                "bearer": SecurityScheme(
                    type="http",
                    scheme="bearer",
                    description="Every route but /healthz and /readyz needs a key.",
                )
            }
            if keys_configured
            else None
        ),
        security=[{"bearer": []}] if keys_configured else None,
    )


def swagger_ui_files() -> Path:
    """Swagger UI's distribution (``dist/``) inside the installed ``flask-swagger-ui`` package,
    found without importing it: its module imports Flask, which this server never runs."""
    spec = importlib.util.find_spec("flask_swagger_ui")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("/docs needs the flask-swagger-ui package (the [server] extra)")
    return Path(spec.submodule_search_locations[0]) / "dist"


def assets() -> Router:
    """Swagger UI's files, from the installed ``flask-swagger-ui`` package."""
    return create_static_files_router(
        path=ASSETS, directories=[swagger_ui_files()], include_in_schema=False
    )
