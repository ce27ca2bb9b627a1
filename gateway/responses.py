"""Embeddings to bytes: OpenAI-shaped JSON (orjson) or raw little-endian floats."""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Literal

import numpy as np
import orjson

if TYPE_CHECKING:
    from gateway.service import Embeddings

BINARY_MEDIA_TYPE = "application/octet-stream"
BinaryDtype = Literal["float32", "float16"]


def openai_json(
    vectors: np.ndarray, model_id: str, encoding_format: Literal["float", "base64"]
) -> bytes:
    """The OpenAI embeddings response. ``base64`` is little-endian float32, as OpenAI sends it."""
    data: list[dict[str, object]]
    if encoding_format == "base64":
        raw = np.ascontiguousarray(vectors, dtype="<f4")
        data = [
            {"object": "embedding", "index": i, "embedding": base64.b64encode(row).decode()}
            for i, row in enumerate(raw)
        ]
    else:
        data = [
            {"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(vectors)
        ]
    body = {
        "object": "list",
        "data": data,
        "model": model_id,
        # Images carry no text tokens; `images` says what was counted.
        "usage": {"prompt_tokens": 0, "total_tokens": 0, "images": len(vectors)},
    }
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


def binary(vectors: np.ndarray, dtype: BinaryDtype) -> tuple[bytes, dict[str, str]]:
    """Row-major ``[n, D]`` little-endian floats, with the shape and dtype in headers."""
    raw = np.ascontiguousarray(vectors, dtype="<f2" if dtype == "float16" else "<f4")
    headers = {
        "X-Embedding-Shape": f"{raw.shape[0]},{raw.shape[1]}",
        "X-Embedding-Dtype": dtype,
    }
    return raw.tobytes(), headers


def server_timing(result: Embeddings) -> str:
    """W3C Server-Timing: where the request's time went inside the gateway (milliseconds)."""
    return (
        f'decode;dur={result.decode_seconds * 1000:.2f};desc="decode+preprocess", '
        f'infer;dur={result.infer_seconds * 1000:.2f};desc="triton"'
    )
