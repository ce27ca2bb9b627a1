"""Embeddings to bytes: OpenAI-shaped JSON (orjson) or raw little-endian floats."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import orjson

from clip_gateway.errors import EmbeddingError
from clip_gateway.http.problems import problem_of
from clip_gateway.http.schemas import BinaryDtype, EncodingFormat

if TYPE_CHECKING:
    from clip_gateway.pipeline.service import Embeddings

JSON_MEDIA_TYPE = "application/json"
BINARY_MEDIA_TYPE = "application/octet-stream"


def openai_json(
    vectors: np.ndarray,
    model_id: str,
    encoding_format: EncodingFormat,
    *,
    indices: Sequence[int] | None = None,
    errors: Sequence[EmbeddingError] | None = None,
    usage: dict[str, int] | None = None,
) -> bytes:
    """The OpenAI embeddings response. ``base64`` is little-endian float32, as OpenAI sends it.

    ``index`` is each row's position in the request (``indices``, default 0..n-1). With
    ``errors`` (skip mode) the failed items are absent from ``data`` and described in ``errors``.
    """
    indices = range(len(vectors)) if indices is None else indices
    data: list[dict[str, object]]
    if encoding_format == "base64":
        raw = np.ascontiguousarray(vectors, dtype="<f4")
        data = [
            {"object": "embedding", "index": i, "embedding": base64.b64encode(row).decode()}
            for i, row in zip(indices, raw, strict=True)
        ]
    else:
        data = [
            {"object": "embedding", "index": i, "embedding": row}
            for i, row in zip(indices, vectors, strict=True)
        ]
    body: dict[str, object] = {
        "object": "list",
        "data": data,
        "model": model_id,
        # Images carry no text tokens; `images` and `texts` say what was embedded.
        "usage": usage
        or {
            "prompt_tokens": 0,
            "total_tokens": 0,
            "images": len(vectors),
            "texts": 0,
        },
    }
    if errors is not None:
        body["errors"] = [item_error(exc) for exc in errors]
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


def item_error(exc: EmbeddingError) -> dict[str, object]:
    """One skipped item, in the terms of a problem document (schemas.ItemError)."""
    problem = problem_of(exc)
    return {
        "index": exc.index,
        "status": problem.status,
        "type": problem.type,
        "title": problem.title,
        "detail": exc.reason,
    }


def binary(
    vectors: np.ndarray,
    dtype: BinaryDtype,
    *,
    indices: Sequence[int] | None = None,
    failed: Sequence[int] | None = None,
) -> tuple[bytes, dict[str, str]]:
    """Row-major ``[n, D]`` little-endian floats, with the shape and dtype in headers.

    In skip mode ``X-Embedding-Indices`` maps rows to request positions and
    ``X-Embedding-Failed`` lists the positions that failed (details only in the JSON form).
    """
    raw = np.ascontiguousarray(vectors, dtype="<f2" if dtype == "float16" else "<f4")
    headers = {
        "X-Embedding-Shape": f"{raw.shape[0]},{raw.shape[1]}",
        "X-Embedding-Dtype": dtype,
    }
    if indices is not None:
        headers["X-Embedding-Indices"] = ",".join(map(str, indices))
    if failed is not None:
        headers["X-Embedding-Failed"] = ",".join(map(str, failed))
    return raw.tobytes(), headers


def server_timing(result: Embeddings) -> str:
    """W3C Server-Timing: where the request's time went inside the gateway (milliseconds)."""
    timings = [
        f'decode;dur={result.decode_seconds * 1000:.2f};desc="decode+preprocess"',
        f'infer;dur={result.infer_seconds * 1000:.2f};desc="triton"',
    ]
    if result.texts:
        timings.insert(1, f'tokenize;dur={result.tokenize_seconds * 1000:.2f};desc="tokenize"')
    return ", ".join(timings)


def usage(result: Embeddings) -> dict[str, int]:
    """OpenAI's ``usage``: text tokens the model read, and what was embedded."""
    return {
        "prompt_tokens": result.tokens,
        "total_tokens": result.tokens,
        "images": result.images,
        "texts": result.texts,
    }
