"""Every class of bad input gets a clear problem+json 4xx naming what and which item."""

from __future__ import annotations

import base64
from concurrent.futures import ThreadPoolExecutor

import pytest
from litestar.testing import TestClient

from clip_gateway.config.settings import ServerSettings
from clip_gateway.http.app import create_app
from tests import samples
from tests.fakes import FakeBackend

PROBLEM = "application/problem+json"


def post_images(client: TestClient, *images: bytes):
    files = [
        ("image", (f"{i}.bin", data, "application/octet-stream")) for i, data in enumerate(images)
    ]
    return client.post("/v1/embeddings", files=files)


def problem(response, status: int, slug: str, index: int | None = None) -> dict:
    assert response.status_code == status, response.text[:500][:500]
    assert response.headers["content-type"].startswith(PROBLEM)
    body = response.json()
    assert body["status"] == status
    assert body["type"].endswith("/" + slug), body
    assert body["title"] and body["detail"]
    assert body.get("index") == index
    return body


@pytest.mark.parametrize(
    ("bad", "status", "slug", "words"),
    [
        (b"", 422, "invalid-image", "empty"),
        (b"hello, I am not an image at all", 422, "invalid-image", "not an image"),
        (samples.truncated_jpeg(), 422, "invalid-image", "JPEG"),
        (samples.corrupt_jpeg(), 422, "invalid-image", "JPEG"),
        (samples.bmp(), 415, "unsupported-media-type", "bmp"),
        (b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, 422, "invalid-image", "png"),
        (samples.claims_pixels(60000, 60000), 422, "image-too-large", "pixels"),
    ],
    ids=["empty", "not-image", "truncated", "corrupt", "bmp", "broken-png", "pixel-bomb"],
)
def test_bad_item_names_its_index(
    client: TestClient, bad: bytes, status: int, slug: str, words: str
) -> None:
    good = samples.compact(0)
    body = problem(post_images(client, good, good, bad, good), status, slug, index=2)
    assert words.lower() in body["detail"].lower()


def test_webp_where_pillow_was_built_without_it_is_a_415_naming_the_item(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    from PIL import Image

    Image.init()
    monkeypatch.delitem(Image.OPEN, "WEBP")
    good = samples.compact(0)
    body = problem(post_images(client, good, samples.webp(0), good), 415,
                   "unsupported-media-type", index=1)  # fmt: skip
    assert "built without webp" in body["detail"]


def test_image_over_the_byte_limit(client: TestClient) -> None:
    big = samples.compact(0) + b"\x00" * (1 << 20)
    problem(post_images(client, samples.compact(1), big), 413, "payload-too-large", index=1)


def test_too_many_images(client: TestClient) -> None:
    problem(post_images(client, *[samples.compact(0)] * 17), 413, "payload-too-large", index=16)
    images = [base64.b64encode(samples.compact(0)).decode()] * 17
    payload = {"input": images, "modality": "image"}
    problem(client.post("/v1/embeddings", json=payload), 413, "payload-too-large", 16)


def test_body_over_the_limit_is_refused_from_its_content_length(client: TestClient) -> None:
    response = client.post(
        "/v1/embeddings",
        content=b"x" * 1024,
        headers={"content-type": "application/json", "content-length": str(2 << 30)},
    )
    assert response.status_code == 413
    assert response.headers["content-type"].startswith(PROBLEM)


def test_streamed_body_over_the_limit(client: TestClient) -> None:
    big = [samples.compact(i) + b"\x00" * 900_000 for i in range(3)]  # 2.7 MB > 2 MiB
    response = post_images(client, *big)
    assert response.status_code == 413
    assert response.headers["content-type"].startswith(PROBLEM)


@pytest.mark.parametrize(
    ("body", "status", "slug"),
    [
        (b"{", 400, "invalid-request"),
        (b'{"input": 5}', 422, "unprocessable-request"),
        (b'{"input": [[1, 2, 3]]}', 422, "unprocessable-request"),
        (b'{"model": "ViT-B-32"}', 422, "unprocessable-request"),
        (b'{"input": []}', 400, "invalid-request"),
        (b'{"input": ["x"], "encoding_format": "bits"}', 422, "unprocessable-request"),
    ],
    ids=["syntax", "wrong-type", "token-ids", "no-input", "empty-list", "bad-format"],
)
def test_malformed_json(client: TestClient, body: bytes, status: int, slug: str) -> None:
    response = client.post(
        "/v1/embeddings", content=body, headers={"content-type": "application/json"}
    )
    problem(response, status, slug)


def test_malformed_base64_names_the_item(client: TestClient) -> None:
    good = base64.b64encode(samples.compact(0)).decode()
    for bad in ("not base64!!", "data:image/jpeg,rawbytes", "QUJD="):
        body = problem(
            client.post("/v1/embeddings", json={"input": [good, bad], "modality": "image"}),
            422,
            "invalid-image",
            index=1,
        )
        assert "base64" in body["detail"] or "not an image" in body["detail"]


def test_unknown_model(client: TestClient) -> None:
    payload = {
        "model": "text-embedding-3-small",
        "input": ["a photo of a cat"],
    }
    body = problem(client.post("/v1/embeddings", json=payload), 404, "unknown-model")
    assert "ViT-B-32" in body["detail"]


@pytest.mark.parametrize("content_type", ["text/plain", "image/jpeg", None])
def test_unsupported_request_content_type(client: TestClient, content_type: str | None) -> None:
    headers = {"content-type": content_type} if content_type else {}
    response = client.post("/v1/embeddings", content=samples.compact(0), headers=headers)
    problem(response, 415, "unsupported-media-type")


def test_malformed_multipart(client: TestClient) -> None:
    response = client.post(
        "/v1/embeddings",
        content=b"--xyz\r\nno headers here",
        headers={"content-type": "multipart/form-data; boundary=xyz"},
    )
    problem(response, 400, "invalid-request")
    response = client.post(
        "/v1/embeddings", content=b"abc", headers={"content-type": "multipart/form-data"}
    )
    problem(response, 400, "invalid-request")


def test_bad_query_parameter(client: TestClient) -> None:
    response = client.post(
        "/v1/embeddings?dtype=int8",
        files=[("image", ("a.jpg", samples.compact(0), "image/jpeg"))],
    )
    assert response.status_code == 400
    assert response.headers["content-type"].startswith(PROBLEM)


@pytest.mark.parametrize(
    ("mode", "status", "slug", "retry_after"),
    [
        ("unavailable", 503, "backend-unavailable", "2"),
        ("slow", 504, "deadline-exceeded", None),  # the request's own deadline fires first
        ("error", 502, "backend-error", None),
    ],
)
def test_backend_failures_map_to_5xx(
    fake: FakeBackend, mode: str, status: int, slug: str, retry_after: str | None
) -> None:
    settings = ServerSettings(canary_interval_s=0, decode_threads=1, request_timeout_s=0.5)
    if mode == "slow":
        fake.hold()
    else:
        fake.mode = mode
    with TestClient(create_app(settings, lambda *_: fake)) as client:
        response = post_images(client, samples.compact(0))
    fake.release()
    body = problem(response, status, slug)
    assert response.headers.get("retry-after") == retry_after
    assert "Traceback" not in body["detail"]
    # the image batch the backend lent went back, whether its call failed or was cancelled
    assert fake.lent == 0 and fake.batches == (mode != "unavailable")


def test_bad_requests_do_not_disturb_good_ones(client: TestClient, fake: FakeBackend) -> None:
    """Hostile and good requests interleaved on the same app: every good one succeeds."""
    bad = [b"", samples.truncated_jpeg(), samples.claims_pixels(60000, 60000), samples.bmp()]
    good = samples.compact(3)
    expected = post_images(client, good).json()["data"][0]["embedding"]

    def send(i: int) -> tuple[int, object]:
        if i % 2:
            response = post_images(client, good, bad[i % len(bad)])
            return response.status_code, None
        response = post_images(client, good)
        return response.status_code, response.json()["data"][0]["embedding"]

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(send, range(40)))
    for i, (status, embedding) in enumerate(results):
        if i % 2:
            assert 400 <= status < 500
        else:
            assert status == 200
            assert embedding == expected
    assert fake.batches >= 21 and fake.lent == 0  # every lent batch went back
    assert client.get("/healthz").status_code == 200
