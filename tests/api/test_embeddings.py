"""POST /v1/embeddings on the fake backend: both request forms, every response form."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from litestar.testing import TestClient

from tests import samples
from tests.fakes import FakeBackend


def multipart(*images: bytes, name: str = "image") -> list[tuple[str, tuple[str, bytes, str]]]:
    return [(name, (f"{i}.jpg", data, "image/jpeg")) for i, data in enumerate(images)]


def vectors(response_json: dict) -> np.ndarray:
    return np.array([row["embedding"] for row in response_json["data"]], dtype=np.float32)


def embed_one(client: TestClient, image: bytes) -> np.ndarray:
    response = client.post("/v1/embeddings", files=multipart(image))
    assert response.status_code == 200, response.text[:500][:500]
    return vectors(response.json())[0]


def test_multipart_batch_in_openai_shape(client: TestClient) -> None:
    images = [samples.compact(i) for i in range(3)]
    response = client.post("/v1/embeddings", files=multipart(*images))
    assert response.status_code == 200, response.text[:500][:500]
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["object"] == "list"
    assert body["model"] == "ViT-B-32"
    assert body["usage"] == {"prompt_tokens": 0, "total_tokens": 0, "images": 3, "texts": 0}
    timing = dict(
        part.strip().split(";")[0:2] for part in response.headers["server-timing"].split(",")
    )
    assert set(timing) == {"decode", "infer"}
    assert all(float(v.removeprefix("dur=")) >= 0 for v in timing.values())
    assert [row["index"] for row in body["data"]] == [0, 1, 2]
    assert {row["object"] for row in body["data"]} == {"embedding"}
    got = vectors(body)
    assert got.shape == (3, 512)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert not np.allclose(got[0], got[1])


def test_order_is_preserved_across_a_split_batch(client: TestClient, fake: FakeBackend) -> None:
    images = [samples.compact(i) for i in range(10)]
    singles = np.stack([embed_one(client, image) for image in images])
    fake.calls.clear()
    response = client.post("/v1/embeddings", files=multipart(*images))
    assert response.status_code == 200
    assert sorted(fake.calls) == [2, 4, 4]  # max batch 4: split, sent concurrently
    np.testing.assert_allclose(vectors(response.json()), singles, atol=1e-6)


def test_parts_keep_their_order_whatever_their_field_names(client: TestClient) -> None:
    a, b, c = (samples.compact(i) for i in range(3))
    files = [
        ("first", ("a.jpg", a, "image/jpeg")),
        ("second", ("b.jpg", b, "image/jpeg")),
        ("first", ("c.jpg", c, "image/jpeg")),
    ]
    response = client.post("/v1/embeddings", files=files)
    expected = np.stack([embed_one(client, x) for x in (a, b, c)])
    np.testing.assert_allclose(vectors(response.json()), expected, atol=1e-6)


def test_multipart_options_fields(client: TestClient) -> None:
    files = [*multipart(samples.compact(0)), ("encoding_format", (None, b"base64", "text/plain"))]
    files.append(("normalize", (None, b"false", "text/plain")))
    response = client.post("/v1/embeddings", files=files)
    assert response.status_code == 200, response.text[:500][:500]
    row = response.json()["data"][0]["embedding"]
    raw = np.frombuffer(base64.b64decode(row), dtype="<f4")
    assert raw.shape == (512,)
    assert abs(float(np.linalg.norm(raw)) - 1.0) > 1e-3  # not normalised


@pytest.mark.parametrize("encoding_format", ["float", "base64"])
def test_openai_json_form(client: TestClient, encoding_format: str) -> None:
    images = [samples.compact(i) for i in range(3)]
    payload = {
        "model": "ViT-B-32",
        "input": [
            {"image": base64.b64encode(images[0]).decode()},
            *("data:image/jpeg;base64," + base64.b64encode(x).decode() for x in images[1:]),
        ],
        "encoding_format": encoding_format,
    }
    response = client.post("/v1/embeddings", json=payload)
    assert response.status_code == 200, response.text[:500][:500]
    rows = [row["embedding"] for row in response.json()["data"]]
    if encoding_format == "base64":
        got = np.stack([np.frombuffer(base64.b64decode(r), dtype="<f4") for r in rows])
    else:
        got = np.array(rows, dtype=np.float32)
    expected = np.stack([embed_one(client, x) for x in images])
    np.testing.assert_allclose(got, expected, atol=1e-6)


def test_json_single_string_input_and_alias(client: TestClient) -> None:
    image = samples.compact(4)
    response = client.post(
        "/v1/embeddings",
        json={"model": "clip", "input": base64.b64encode(image).decode(), "modality": "image"},
    )
    assert response.status_code == 200, response.text[:500][:500]
    np.testing.assert_allclose(vectors(response.json())[0], embed_one(client, image), atol=1e-6)


@pytest.mark.parametrize(("dtype", "numpy_dtype"), [("float32", "<f4"), ("float16", "<f2")])
def test_binary_response(client: TestClient, dtype: str, numpy_dtype: str) -> None:
    images = [samples.compact(i) for i in range(2)]
    response = client.post(
        f"/v1/embeddings?dtype={dtype}",
        files=multipart(*images),
        headers={"Accept": "application/octet-stream"},
    )
    assert response.status_code == 200, response.text[:500][:500]
    assert response.headers["content-type"] == "application/octet-stream"
    assert response.headers["x-embedding-shape"] == "2,512"
    assert response.headers["x-embedding-dtype"] == dtype
    got = np.frombuffer(response.content, dtype=numpy_dtype).reshape(2, 512)
    expected = np.stack([embed_one(client, x) for x in images])
    np.testing.assert_allclose(
        got.astype(np.float32), expected, atol=1e-3 if dtype == "float16" else 1e-6
    )


def test_json_is_the_default_for_wildcard_accept(client: TestClient) -> None:
    response = client.post(
        "/v1/embeddings", files=multipart(samples.compact(0)), headers={"Accept": "*/*"}
    )
    assert response.headers["content-type"] == "application/json"


def test_normalize_opt_out_returns_raw_vectors(client: TestClient, fake: FakeBackend) -> None:
    image = samples.compact(5)
    raw = client.post("/v1/embeddings?normalize=false", files=multipart(image))
    unit = client.post("/v1/embeddings", files=multipart(image))
    raw_v, unit_v = vectors(raw.json())[0], vectors(unit.json())[0]
    np.testing.assert_allclose(raw_v / np.linalg.norm(raw_v), unit_v, atol=1e-6)
    assert abs(float(np.linalg.norm(raw_v)) - 1) > 1e-3


GRAY = ("L", "RGB")


@pytest.mark.parametrize(
    ("image", "modes"),
    [
        (samples.png(0), ()),
        (samples.png(0, "RGBA"), ()),
        (samples.png(0, "P"), ()),
        (samples.png(0, "L"), GRAY),
        (samples.webp(0), ()),
        (samples.grayscale_jpeg(0), GRAY),
        (samples.cmyk_jpeg(0), ()),
    ],
    ids=["png", "png-rgba", "png-palette", "png-gray", "webp", "jpeg-gray", "jpeg-cmyk"],
)
def test_other_formats_and_colour_modes(
    client: TestClient, image: bytes, modes: tuple[str, ...]
) -> None:
    response = client.post("/v1/embeddings", files=multipart(image))
    assert response.status_code == 200, response.text[:500]
    picture = samples.small_photo(0)
    for mode in modes:
        picture = picture.convert(mode)
    reference = embed_one(client, samples.encode(picture, "PNG"))
    # the same picture through another container/colour model: its embedding barely moves
    assert float(vectors(response.json())[0] @ reference) > 0.99
