"""Admission control, deadlines, skip-invalid, API keys and the readiness canary (fake backend)."""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from litestar.testing import TestClient

from clip_gateway.config.settings import ServerSettings
from clip_gateway.http import spread
from clip_gateway.http.app import create_app
from tests import samples
from tests.controlled import wait_until
from tests.fakes import FakeBackend
from tests.metrics import sample, sample_or_zero

PROBLEM = "application/problem+json"


def files(*images: bytes) -> list[tuple[str, tuple[str, bytes, str]]]:
    return [("image", (f"{i}.jpg", data, "image/jpeg")) for i, data in enumerate(images)]


def make_client(fake: FakeBackend, **overrides: object) -> TestClient:
    settings = ServerSettings(
        **{
            "canary_interval_s": 0,
            "decode_threads": 2,
            # admission made countable: each image costs ~0.1 s, at most 8 of them in flight
            "admission_infer_s_per_image": 0.1,
            "admission_horizon_s": 0.85,
            "max_items_per_request": 8,
            **overrides,
        }
    )
    return TestClient(create_app(settings, lambda *_: fake))


def test_admission_is_counted_in_work_and_fails_fast(fake: FakeBackend) -> None:
    fake.hold()
    results: dict[str, object] = {}
    with make_client(fake, max_items_per_request=8) as client:
        before = client.get("/metrics").text

        def post(name: str, count: int, seed: int) -> None:
            results[name] = client.post(
                "/v1/embeddings", files=files(*[samples.compact(seed)] * count)
            )

        holder = threading.Thread(target=post, args=("holder", 6, 0))
        holder.start()
        # max batch 4: the 6 images reach the backend as two calls
        wait_until(lambda: fake.arrivals >= 2, "the 6-image request reached the backend")
        refused = client.post("/v1/embeddings", files=files(*[samples.compact(1)] * 3))
        # refused while the 6 images were still held in the backend: at once, not after them
        assert holder.is_alive() and fake.arrivals == 2
        fits = threading.Thread(target=post, args=("fits", 2, 2))
        fits.start()
        wait_until(lambda: fake.arrivals >= 3, "the 2-image request was admitted beside the 6")
        fake.release()
        holder.join()
        fits.join()
        after = client.get("/metrics").text
    assert refused.status_code == 429
    assert refused.headers["content-type"].startswith(PROBLEM)
    assert int(refused.headers["retry-after"]) >= 1
    # 6 images held (0.6 s) plus 3 more would be 0.9 s of work, over the 0.85 s horizon
    assert refused.json()["horizon_s"] == 0.85
    assert 0.6 <= refused.json()["backlog_s"] < 0.85
    assert results["holder"].status_code == results["fits"].status_code == 200  # type: ignore[union-attr]
    assert sample(after, "gateway_inflight_items") == 0
    rejected = "gateway_rejected_requests_total"
    assert (
        sample(after, rejected, reason="overloaded")
        - sample_or_zero(before, rejected, reason="overloaded")
        == 1
    )


def test_settings_refuse_a_horizon_longer_than_the_deadline() -> None:
    with pytest.raises(ValueError, match="admission_horizon_s"):
        ServerSettings(request_timeout_s=10, admission_horizon_s=11)
    assert ServerSettings(request_timeout_s=10).horizon_s == 5.0


@pytest.mark.slow
def test_request_deadline(fake: FakeBackend) -> None:
    fake.hold()  # never answers by itself
    # a deadline long enough for the decode to end on a loaded machine (0.3 s was not, once):
    # the backend, which never answers, is what must run it out
    with make_client(fake, request_timeout_s=2.0, admission_horizon_s=1.0) as client:
        response = client.post("/v1/embeddings", files=files(samples.compact(0)))
        assert response.status_code == 504
        assert response.json()["type"].endswith(("/deadline-exceeded", "/backend-timeout"))
        assert fake.arrivals == 1  # it reached the backend, which held it past the deadline
        assert sample(client.get("/metrics").text, "gateway_inflight_items") == 0
    fake.release()


@pytest.fixture
def mixed() -> list[bytes]:
    return [
        samples.compact(0),
        b"not an image",
        samples.compact(1),
        samples.bmp(),
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
    payload = {
        "input": [base64.b64encode(x).decode() for x in mixed],
        "modality": "image",
        "skip_invalid": True,
    }
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


def test_only_the_probes_answer_without_a_key(keyed: TestClient) -> None:
    for path in ("/healthz", "/readyz"):
        assert keyed.get(path).status_code == 200, path
    for path in ("/metrics", "/docs", "/docs/openapi.json", "/v1/models"):
        assert keyed.get(path).status_code == 401, path
        assert keyed.get(path, headers={"Authorization": "Bearer env-key"}).status_code == 200
    doc = keyed.get("/docs/openapi.json", headers={"Authorization": "Bearer env-key"}).json()
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert doc["security"] == [{"bearer": []}]
    assert doc["paths"]["/healthz"]["get"]["security"] == [{}]  # the probes are exempt


def test_no_security_is_declared_without_keys(client: TestClient) -> None:
    doc = client.get("/docs/openapi.json").json()
    assert "security" not in doc
    assert "securitySchemes" not in doc.get("components", {})


def test_keys_never_reach_the_settings_repr() -> None:
    settings = ServerSettings(api_keys=("s3cret",))
    assert "s3cret" not in repr(settings) and "s3cret" not in str(settings.model_dump())


def test_readiness_waits_for_every_worker_to_accept(fake: FakeBackend, tmp_path: Path) -> None:
    """Several workers: not ready while one of them accepts no connection yet (a keep-alive
    connection made then would stay with the others for good, http/spread.py)."""
    board = tmp_path / "connections"
    spread.Board.create(board, 2)
    first, second = spread.Board(board), spread.Board(board)
    first.claim()  # one worker accepts
    settings = ServerSettings(canary_interval_s=0, decode_threads=2)
    try:
        with TestClient(create_app(settings, lambda *_: fake, board=board)) as client:
            waiting = client.get("/readyz")
            assert waiting.status_code == 503
            assert "1 of the gateway's 2 workers accept connections" in waiting.json()["detail"]
            second.claim()  # and the other (this process holds both slots here)
            assert client.get("/readyz").status_code == 200
    finally:
        first.close()
        second.close()


def test_readiness_follows_the_canary(fake: FakeBackend) -> None:
    def readyz() -> tuple[int, str]:
        response = client.get("/readyz")
        body = response.json()
        return response.status_code, str(body.get("canary") or body.get("detail"))

    with make_client(fake, canary_interval_s=0.1) as client:
        wait_until(lambda: readyz()[0] == 200, "canary passes on a healthy backend")
        assert readyz()[1].startswith("image canary cosine 1.0")
        assert "text canary cosine 1.0" in readyz()[1]
        fake.mode = "nan"  # a broken engine: READY in Triton, garbage out
        wait_until(lambda: readyz()[0] == 503, "canary fails on NaN")
        assert "not finite" in readyz()[1]
        fake.mode = "negate"  # wrong values: cosine -1 against the first result
        wait_until(lambda: "cosine -1.0" in readyz()[1], "canary sees the wrong values")
        assert readyz()[0] == 503
        fake.mode = "ok"
        wait_until(lambda: readyz()[0] == 200, "canary recovers")
        assert client.get("/healthz").status_code == 200


def test_overload_refuses_with_429_and_loses_nothing(fake: FakeBackend) -> None:
    """A full budget refuses every newcomer with 429; under concurrency every answer is either
    the request's own embedding or a clean 429, never someone else's."""
    images = [samples.compact(i) for i in range(6)]
    with make_client(fake, max_items_per_request=2, admission_horizon_s=0.45) as client:
        expected = [
            client.post("/v1/embeddings", files=files(x)).json()["data"][0]["embedding"]
            for x in images
        ]
        base = fake.arrivals
        fake.hold()
        with ThreadPoolExecutor(2) as holders:
            held = [holders.submit(client.post, "/v1/embeddings", files=files(*images[:2]))
                    for _ in range(2)]  # fmt: skip
            wait_until(lambda: fake.arrivals >= base + 2, "4 images in flight: the budget is full")
            refused = [client.post("/v1/embeddings", files=files(x)) for x in images]
            fake.release()
            held_statuses = [f.result().status_code for f in held]
        assert [r.status_code for r in refused] == [429] * 6
        assert held_statuses == [200, 200]

        fake.delay_s = 0.02

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
