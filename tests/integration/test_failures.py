"""What users meet when things go wrong, over real HTTP against a real gateway and a real
Triton (the control model, tests/models/control.py, for behaviour a real model cannot be made to
show on demand). The API suite checks the same on the in-process fake; this is the real stack."""

from __future__ import annotations

import math
import socket
import threading

import httpx
import numpy as np
import pytest

from clip_gateway.config.processes import reserve_port
from tests import samples
from tests.controlled import Control, wait_until
from tests.metrics import sample, sample_or_zero

PROBLEM = "application/problem+json"
REJECTED = "gateway_rejected_requests_total"


def files(*images: bytes) -> list[tuple[str, tuple[str, bytes, str]]]:
    return [("image", (f"{i}.jpg", data, "image/jpeg")) for i, data in enumerate(images)]


def problem(response: httpx.Response, status: int, slug: str) -> dict:
    assert response.status_code == status, response.text[:500]
    assert response.headers["content-type"].startswith(PROBLEM)
    body = response.json()
    assert body["status"] == status and body["type"].endswith("/" + slug), body
    assert "Traceback" not in body["detail"]
    return body


def metrics(url: str, **headers: str) -> str:
    return httpx.get(f"{url}/metrics", headers=headers, timeout=30).text


@pytest.fixture
def triton_url(control_triton) -> str:
    return control_triton[0].grpc_url


@pytest.fixture(params=["grpc", "http"])
def via(request, control_triton) -> dict[str, str]:
    """How the inference calls reach Triton: gRPC, or its HTTP endpoint (the launcher's)."""
    if request.param == "grpc":
        return {}
    return {"GATEWAY_TRITON_HTTP_URL": control_triton[0].http_url}


def test_every_route_but_the_probes_needs_a_key(control_triton, start_gateway) -> None:
    triton, _ = control_triton
    gw = start_gateway(
        triton.grpc_url,
        GATEWAY_API_KEYS='["k-1", "k-2"]',
        GATEWAY_TRITON_METRICS_URL=triton.metrics_url,
        GATEWAY_CANARY_INTERVAL_S="0",
    )
    good = {"Authorization": "Bearer k-2"}
    doc = httpx.get(f"{gw.url}/docs/openapi.json", headers=good).json()
    routes = [(m.upper(), p) for p, ops in doc["paths"].items() for m in ops]
    routes += [("GET", "/docs"), ("GET", "/docs/openapi.json")]
    assert ("GET", "/metrics/triton") in routes and ("POST", "/v1/embeddings") in routes
    public = {("GET", "/healthz"), ("GET", "/readyz")}
    body = {"files": files(samples.compact(0))}
    with httpx.Client(base_url=gw.url, timeout=60) as http:
        for method, path in routes:
            kwargs = body if method == "POST" else {}
            if (method, path) in public:
                assert http.request(method, path, **kwargs).status_code == 200, path
                continue
            for headers in ({}, {"Authorization": "Bearer k-3"}, {"Authorization": "k-1"}):
                refused = http.request(method, path, headers=headers, **kwargs)
                problem(refused, 401, "unauthorized")
                assert refused.headers["www-authenticate"].startswith("Bearer"), path
                assert "k-1" not in refused.text and "k-2" not in refused.text
            accepted = http.request(method, path, headers=good, **kwargs)
            assert accepted.status_code == 200, (path, accepted.text[:300])


def test_a_full_horizon_answers_429_at_once_with_a_computed_retry_after(
    control: Control, triton_url, start_gateway
) -> None:
    # each image costs 4 s of model work (pinned, so the test does not depend on this CPU);
    # 10 s of work may be in flight: two images fit, a third does not
    gw = start_gateway(
        triton_url,
        GATEWAY_ADMISSION_INFER_S_PER_IMAGE="4",
        GATEWAY_ADMISSION_HORIZON_S="10",
        GATEWAY_CANARY_INTERVAL_S="0",
    )
    before = metrics(gw.url)
    control.set(hold=True)
    arrived = control.arrivals()
    held: dict[str, httpx.Response] = {}
    images = [samples.compact(i) for i in range(2)]

    def hold() -> None:
        held["response"] = httpx.post(f"{gw.url}/v1/embeddings", files=files(*images), timeout=60)

    holder = threading.Thread(target=hold)
    holder.start()
    control.wait_arrivals(arrived + 1)  # both images admitted and parked in the model
    refused = httpx.post(f"{gw.url}/v1/embeddings", files=files(samples.compact(9)), timeout=30)
    still_held = holder.is_alive()
    control.release()
    holder.join(60)
    body = problem(refused, 429, "overloaded")
    assert still_held  # refused while the budget was taken, not after it was given back
    # the backlog (8 s and the images' decode) must drain below 10 - 4 s before one more
    # image fits: a little over 2 s, so Retry-After is 3
    wait = math.ceil(body["backlog_s"] + 4 - body["horizon_s"])
    assert body["horizon_s"] == 10 and 8 <= body["backlog_s"] < 8.01
    assert int(refused.headers["retry-after"]) in (wait, wait + 1)
    assert int(refused.headers["retry-after"]) == 3
    assert held["response"].status_code == 200
    assert len(held["response"].json()["data"]) == 2
    after = metrics(gw.url)
    assert (
        sample(after, REJECTED, reason="overloaded")
        - sample_or_zero(before, REJECTED, reason="overloaded")
        == 1
    )
    assert sample(after, "gateway_inflight_items") == 0


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_triton_down_is_503_with_retry_after(start_gateway, transport: str) -> None:
    nothing_there = reserve_port()  # reserved, so nothing will be listening on it
    address = f"127.0.0.1:{nothing_there.port}"
    via = {"GATEWAY_TRITON_HTTP_URL": f"http://{address}"} if transport == "http" else {}
    gw = start_gateway(address, ready=False, GATEWAY_CANARY_INTERVAL_S="0", **via)
    try:
        response = httpx.post(
            f"{gw.url}/v1/embeddings", files=files(samples.compact(0)), timeout=60
        )
        problem(response, 503, "backend-unavailable")
        assert int(response.headers["retry-after"]) >= 1
        ready = httpx.get(f"{gw.url}/readyz", timeout=30)
        problem(ready, 503, "backend-unavailable")
        assert httpx.get(f"{gw.url}/healthz").status_code == 200  # alive, just not ready
    finally:
        nothing_there.release()


def test_a_slow_backend_is_504_and_releases_its_budget(
    control: Control, triton_url, via, start_gateway
) -> None:
    gw = start_gateway(
        triton_url, GATEWAY_REQUEST_TIMEOUT_S="1", GATEWAY_CANARY_INTERVAL_S="0", **via
    )
    control.set(hold=True)
    response = httpx.post(f"{gw.url}/v1/embeddings", files=files(samples.compact(0)), timeout=60)
    control.release()
    body = problem(response, 504, response.json()["type"].rsplit("/", 1)[-1])
    assert body["type"].endswith(("/deadline-exceeded", "/backend-timeout"))
    assert sample(metrics(gw.url), "gateway_inflight_items") == 0
    # the gateway is fine afterwards
    again = httpx.post(f"{gw.url}/v1/embeddings", files=files(samples.compact(0)), timeout=60)
    assert again.status_code == 200


def test_a_failing_backend_is_502(control: Control, triton_url, via, start_gateway) -> None:
    gw = start_gateway(triton_url, GATEWAY_CANARY_INTERVAL_S="0", **via)
    control.set("error")
    response = httpx.post(f"{gw.url}/v1/embeddings", files=files(samples.compact(0)), timeout=60)
    body = problem(response, 502, "backend-error")
    assert "failing on purpose" in body["detail"]  # Triton's message, not a Python traceback
    assert "retry-after" not in response.headers


def test_a_vanished_client_has_its_work_cancelled(
    control: Control, triton_url, via, start_gateway
) -> None:
    gw = start_gateway(triton_url, GATEWAY_CANARY_INTERVAL_S="0", **via)
    before = metrics(gw.url)
    control.set(hold=True)
    arrived = control.arrivals()
    request = httpx.Request("POST", f"{gw.url}/v1/embeddings", files=files(samples.compact(0)))
    raw = request.read()
    head = f"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: {len(raw)}\r\n"
    head += f"Content-Type: {request.headers['content-type']}\r\n\r\n"
    with socket.create_connection((gw.host, gw.port), timeout=30) as sock:
        sock.sendall(head.encode() + raw)
        control.wait_arrivals(arrived + 1)  # the request is inside Triton, held
    # the client is gone: the gateway must notice, cancel the gRPC call, free the budget

    def cancelled() -> bool:
        text = metrics(gw.url)
        closed = sample_or_zero(text, REJECTED, reason="client-closed-request")
        return closed - sample_or_zero(before, REJECTED, reason="client-closed-request") == 1

    wait_until(cancelled, "the disconnect was noticed and counted")
    control.release()
    after = metrics(gw.url)
    calls = "gateway_triton_request_duration_seconds_count"
    assert sample(after, calls, model="image", outcome="cancelled") == 1
    assert sample(after, "gateway_inflight_items") == 0


def test_canary_failure_makes_the_gateway_unready(
    control: Control, triton_url, via, start_gateway
) -> None:
    gw = start_gateway(triton_url, GATEWAY_CANARY_INTERVAL_S="0.2", **via)

    def readyz() -> tuple[int, str]:
        response = httpx.get(f"{gw.url}/readyz", timeout=30)
        body = response.json()
        return response.status_code, str(body.get("canary") or body.get("detail"))

    assert readyz()[0] == 200
    control.set("nan")  # READY in Triton, garbage out: a broken engine
    wait_until(lambda: readyz()[0] == 503, "unready on NaN embeddings")
    assert "not finite" in readyz()[1]
    assert httpx.get(f"{gw.url}/healthz").status_code == 200
    control.set("negate")  # plausible numbers, wrong values
    wait_until(lambda: "cosine -1.0" in readyz()[1], "the canary sees wrong values")
    assert readyz()[0] == 503
    control.set()
    wait_until(lambda: readyz()[0] == 200, "ready again once the backend is healthy")


def test_skip_invalid_reports_each_bad_item(gateway) -> None:
    from tests import reference

    good = [samples.compact(10), samples.png(11), samples.compact(12)]
    mixed = [good[0], b"", good[1], samples.bmp(), b"not an image", good[2]]
    with httpx.Client(base_url=gateway.url, timeout=120) as http:
        whole = http.post("/v1/embeddings", files=files(*mixed))
        problem(whole, 422, "invalid-image")
        assert whole.json()["index"] == 1  # the first bad item decides the whole-request error
        response = http.post("/v1/embeddings?skip_invalid=true", files=files(*mixed))
        binary = http.post(
            "/v1/embeddings?skip_invalid=true",
            files=files(*mixed),
            headers={"Accept": "application/octet-stream"},
        )
    assert response.status_code == 200, response.text[:300]
    body = response.json()
    assert [row["index"] for row in body["data"]] == [0, 2, 5]
    errors = [(e["index"], e["status"], e["type"].rsplit("/", 1)[1]) for e in body["errors"]]
    assert errors == [
        (1, 422, "invalid-image"),
        (3, 415, "unsupported-media-type"),
        (4, 422, "invalid-image"),
    ]
    got = np.array([row["embedding"] for row in body["data"]])
    # measured min cosine 0.99999 for these (compact JPEG, PNG) against open_clip's pipeline
    assert reference.cosines(got, reference.embed_images(good)).min() >= 0.9999
    assert binary.headers["x-embedding-indices"] == "0,2,5"
    assert binary.headers["x-embedding-failed"] == "1,3,4"
    rows = np.frombuffer(binary.content, "<f4").reshape(3, -1)
    np.testing.assert_array_equal(rows, got.astype(np.float32))
