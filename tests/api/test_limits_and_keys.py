"""Admission control, deadlines, skip-invalid, API keys and the readiness canary (fake backend)."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from litestar.testing import TestClient

from gateway.app import create_app
from gateway.settings import GatewaySettings
from tests import samples
from tests.fakes import FakeBackend

PROBLEM = "application/problem+json"


def files(*images: bytes) -> list[tuple[str, tuple[str, bytes, str]]]:
    return [("image", (f"{i}.jpg", data, "image/jpeg")) for i, data in enumerate(images)]


def make_client(fake: FakeBackend, **overrides: object) -> TestClient:
    settings = GatewaySettings(
        **{
            "canary_interval_s": 0,
            "decode_threads": 2,
            "max_inflight_images": 8,
            "max_images_per_request": 8,
            **overrides,
        }
    )
    return TestClient(create_app(settings, lambda *_: fake))


def test_admission_is_counted_in_images_and_fails_fast(fake: FakeBackend) -> None:
    fake.delay = 1.0
    with make_client(fake, max_images_per_request=8) as client:
        holder = threading.Thread(
            target=lambda: client.post("/v1/embeddings", files=files(*[samples.compact(0)] * 6))
        )
        holder.start()
        deadline = time.monotonic() + 5
        while (
            time.monotonic() < deadline
            and "gateway_inflight_images 6.0" not in client.get("/metrics").text
        ):
            time.sleep(0.01)
        started = time.perf_counter()
        refused = client.post("/v1/embeddings", files=files(*[samples.compact(1)] * 3))
        refused_in = time.perf_counter() - started
        fits = client.post("/v1/embeddings", files=files(samples.compact(2), samples.compact(3)))
        holder.join()
        after = client.get("/metrics").text
    assert refused.status_code == 429
    assert refused.headers["content-type"].startswith(PROBLEM)
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["capacity"] == 8
    assert refused_in < 0.5  # refused at once, not after the busy request (1 s)
    assert fits.status_code == 200  # 6 + 2 fit the budget of 8
    assert "gateway_inflight_images 0.0" in after
    assert 'gateway_rejected_requests_total{reason="overloaded"} 1.0' in after


def test_settings_refuse_requests_that_could_never_be_admitted() -> None:
    with pytest.raises(ValueError, match="max_inflight_images"):
        GatewaySettings(max_images_per_request=10, max_inflight_images=8)


def test_request_deadline(fake: FakeBackend) -> None:
    fake.delay = 5.0
    with make_client(fake, request_timeout_s=0.3) as client:
        started = time.perf_counter()
        response = client.post("/v1/embeddings", files=files(samples.compact(0)))
        elapsed = time.perf_counter() - started
        assert response.status_code == 504
        assert response.json()["type"].endswith("/deadline-exceeded")
        assert elapsed < 3
        assert fake.cancelled == 1  # the backend call was cancelled, not left running
        assert "gateway_inflight_images 0.0" in client.get("/metrics").text


@pytest.fixture
def mixed() -> list[bytes]:
    return [
        samples.compact(0),
        b"not an image",
        samples.compact(1),
        samples.gif(),
        samples.compact(2),
    ]


def test_skip_invalid_returns_good_embeddings_and_indexed_errors(
    client: TestClient, mixed: list[bytes]
) -> None:
    whole = client.post("/v1/embeddings", files=files(*mixed))
    assert whole.status_code == 422  # the default stays a whole-request error
    response = client.post("/v1/embeddings?skip_invalid=true", files=files(*mixed))
    assert response.status_code == 200, response.text[:300]
    body = response.json()
    assert [row["index"] for row in body["data"]] == [0, 2, 4]
    assert [(e["index"], e["status"]) for e in body["errors"]] == [(1, 422), (3, 415)]
    assert body["errors"][1]["type"].endswith("/unsupported-media-type")
    singles = [
        client.post("/v1/embeddings", files=files(mixed[i])).json()["data"][0]["embedding"]
        for i in (0, 2, 4)
    ]
    np.testing.assert_allclose([row["embedding"] for row in body["data"]], singles, atol=1e-6)


def test_skip_invalid_in_json_and_binary(client: TestClient, mixed: list[bytes]) -> None:
    payload = {"input": [base64.b64encode(x).decode() for x in mixed], "skip_invalid": True}
    body = client.post("/v1/embeddings", json=payload).json()
    assert [row["index"] for row in body["data"]] == [0, 2, 4]
    binary = client.post(
        "/v1/embeddings?skip_invalid=true",
        files=files(*mixed),
        headers={"Accept": "application/octet-stream"},
    )
    assert binary.headers["x-embedding-shape"] == "3,512"
    assert binary.headers["x-embedding-indices"] == "0,2,4"
    assert binary.headers["x-embedding-failed"] == "1,3"


def test_skip_invalid_with_nothing_valid(client: TestClient) -> None:
    body = client.post("/v1/embeddings?skip_invalid=true", files=files(b"", b"x")).json()
    assert body["data"] == []
    assert [e["index"] for e in body["errors"]] == [0, 1]


@pytest.fixture
def keyed(fake: FakeBackend, tmp_path: Path) -> Iterator[TestClient]:
    key_file = tmp_path / "keys"
    key_file.write_text("# team keys\nfile-key-1\n\nfile-key-2  # ci\n")
    with make_client(fake, api_keys=("env-key",), api_keys_file=key_file) as client:
        yield client


@pytest.mark.parametrize("key", ["env-key", "file-key-1", "file-key-2"])
def test_api_keys_accept_configured_keys(keyed: TestClient, key: str) -> None:
    response = keyed.post(
        "/v1/embeddings",
        files=files(samples.compact(0)),
        headers={"Authorization": f"Bearer {key}"},
    )
    assert response.status_code == 200
    assert keyed.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200


@pytest.mark.parametrize(
    "header", [None, "Bearer", "Bearer wrong", "Basic ZW52LWtleQ==", "Bearer env-key2"]
)
def test_api_keys_refuse_everything_else(keyed: TestClient, header: str | None) -> None:
    headers = {"Authorization": header} if header else {}
    response = keyed.post("/v1/embeddings", files=files(samples.compact(0)), headers=headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert response.headers["content-type"].startswith(PROBLEM)
    assert "env-key" not in response.text
    assert keyed.get("/v1/models", headers=headers).status_code == 401


def test_health_metrics_and_docs_need_no_key(keyed: TestClient) -> None:
    for path in ("/healthz", "/readyz", "/metrics", "/docs/openapi.json"):
        assert keyed.get(path).status_code == 200, path
    doc = keyed.get("/docs/openapi.json").json()
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert doc["paths"]["/v1/embeddings"]["post"]["security"] == [{"bearer": []}]


def test_keys_never_reach_the_settings_repr() -> None:
    settings = GatewaySettings(api_keys=("s3cret",))
    assert "s3cret" not in repr(settings) and "s3cret" not in str(settings.model_dump())


def test_readiness_follows_the_canary(fake: FakeBackend) -> None:
    with make_client(fake, canary_interval_s=0.1) as client:
        deadline = time.monotonic() + 5
        while client.get("/readyz").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.get("/readyz").json()["canary"].startswith("canary cosine 1.0")
        fake.scale = float("nan")  # a broken engine: READY in Triton, garbage out
        deadline = time.monotonic() + 5
        while client.get("/readyz").status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        response = client.get("/readyz")
        assert response.status_code == 503
        assert "not finite" in response.json()["detail"]
        fake.scale = -1.0  # wrong values: cosine -1 against the first result
        time.sleep(0.3)
        assert "cosine -1.0" in client.get("/readyz").json()["detail"]
        fake.scale = 1.0
        deadline = time.monotonic() + 5
        while client.get("/readyz").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.get("/readyz").status_code == 200
        assert client.get("/healthz").status_code == 200


def test_concurrent_overload_loses_nothing(fake: FakeBackend) -> None:
    """Many clients at once: each gets its own embedding or a clean 429, never someone else's."""
    fake.delay = 0.05
    images = [samples.compact(i) for i in range(6)]
    with make_client(fake, max_images_per_request=2, max_inflight_images=4) as client:
        expected = [
            client.post("/v1/embeddings", files=files(x)).json()["data"][0]["embedding"]
            for x in images
        ]

        def send(i: int) -> tuple[int, int, object]:
            response = client.post("/v1/embeddings", files=files(images[i % 6]))
            body = response.json()
            return (
                i,
                response.status_code,
                body["data"][0]["embedding"] if response.status_code == 200 else None,
            )

        with ThreadPoolExecutor(12) as pool:
            results = list(pool.map(send, range(60)))
    statuses = {status for _, status, _ in results}
    assert statuses <= {200, 429}
    assert 200 in statuses
    for i, status, embedding in results:
        if status == 200:
            assert embedding == expected[i % 6]
