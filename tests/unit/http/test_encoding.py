"""Serialisation: OpenAI JSON (float and base64) and the raw binary form; item decoding."""

from __future__ import annotations

import base64

import numpy as np
import orjson
import pytest

from clip_gateway.errors import InvalidImage
from clip_gateway.http import encoding as responses
from clip_gateway.pipeline.items import ImageItem, item_bytes

VECTORS = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)


def test_float_json_round_trips_exactly() -> None:
    body = orjson.loads(responses.openai_json(VECTORS, "m", "float"))
    assert body["object"] == "list"
    assert body["model"] == "m"
    got = np.array([row["embedding"] for row in body["data"]], dtype=np.float32)
    assert np.array_equal(got, VECTORS)  # float32 shortest repr parses back bit-exact


def test_base64_json_is_little_endian_float32() -> None:
    body = orjson.loads(responses.openai_json(VECTORS.astype(">f4"), "m", "base64"))
    got = np.stack([np.frombuffer(base64.b64decode(r["embedding"]), "<f4") for r in body["data"]])
    assert np.array_equal(got, VECTORS)


@pytest.mark.parametrize(("dtype", "numpy_dtype"), [("float32", "<f4"), ("float16", "<f2")])
def test_binary(dtype: str, numpy_dtype: str) -> None:
    raw, headers = responses.binary(VECTORS, dtype)  # type: ignore[arg-type]
    assert headers == {"X-Embedding-Shape": "3,8", "X-Embedding-Dtype": dtype}
    got = np.frombuffer(raw, numpy_dtype).reshape(3, 8)
    np.testing.assert_allclose(got, VECTORS, rtol=1e-3)


def test_item_bytes() -> None:
    assert item_bytes(ImageItem(b"raw")) == b"raw"
    assert item_bytes(ImageItem.from_base64(base64.b64encode(b"abc").decode())) == b"abc"
    uri = "data:image/png;base64," + base64.b64encode(b"xyz").decode()
    assert item_bytes(ImageItem.from_base64(uri)) == b"xyz"
    for bad in ("@@@", "data:image/png,abc", "data:image/png;base64"):
        with pytest.raises(InvalidImage):
            item_bytes(ImageItem.from_base64(bad))
