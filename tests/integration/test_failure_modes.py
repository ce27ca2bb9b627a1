"""Failure modes against the real stack: Triton killed and restarted, clients that vanish or
trickle, hostile bodies. Every request ends promptly with a clear status, nothing is mixed up."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest

from clip_gateway.config.processes import GatewayProcess
from clip_gateway.launcher.local import LocalTriton
from tests import samples
from tests.controlled import wait_until

IMAGES = [samples.compact(200 + i) for i in range(4)]


def files(*images: bytes) -> list[tuple[str, tuple[str, bytes, str]]]:
    return [("image", (f"{i}.jpg", data, "image/jpeg")) for i, data in enumerate(images)]


@dataclass
class Outcome:
    started: float
    ended: float
    status: int
    correct: bool | None


def test_triton_killed_and_restarted_under_load(cpu_repository: Path, tmp_path: Path) -> None:
    triton = LocalTriton(cpu_repository, log_path=tmp_path / "triton-1.log").start()
    ports = {
        "grpc_port": triton.grpc_port,
        "http_port": triton.http_port,
        "metrics_port": triton.metrics_port,
    }
    timeout_s = 10
    env = {
        "GATEWAY_REQUEST_TIMEOUT_S": str(timeout_s),
        "GATEWAY_CANARY_INTERVAL_S": "1",
        "GATEWAY_DECODE_THREADS": "1",
    }
    outcomes: list[Outcome] = []
    failures: list[BaseException] = []
    stop = threading.Event()
    restarted: LocalTriton | None = None
    try:
        with GatewayProcess(triton.grpc_url, env=env, log_path=tmp_path / "gateway.log") as gateway:
            gateway.wait_ready()
            with httpx.Client(base_url=gateway.url, timeout=30) as http:
                reference = [
                    http.post("/v1/embeddings", files=files(x)).json()["data"][0]["embedding"]
                    for x in IMAGES
                ]

                def load(worker: int) -> None:
                    # the client's timeout is the deadline plus a margin: a request that hangs
                    # past the gateway's deadline ends as a recorded failure, not as a status
                    with httpx.Client(base_url=gateway.url, timeout=timeout_s + 10) as client:
                        i = worker
                        while not stop.is_set():
                            image = IMAGES[i % len(IMAGES)]
                            started = time.monotonic()
                            try:
                                response = client.post("/v1/embeddings", files=files(image))
                            except httpx.HTTPError as exc:
                                failures.append(exc)
                                continue
                            correct = None
                            if response.status_code == 200:
                                got = response.json()["data"][0]["embedding"]
                                correct = bool(
                                    np.allclose(got, reference[i % len(IMAGES)], atol=1e-5)
                                )
                            outcomes.append(
                                Outcome(started, time.monotonic(), response.status_code, correct)
                            )
                            i += 1

                def served_since(moment: float, status: int = 200) -> list[Outcome]:
                    return [o for o in list(outcomes) if o.started > moment and o.status == status]

                threads = [threading.Thread(target=load, args=(w,)) for w in range(3)]
                for thread in threads:
                    thread.start()
                wait_until(lambda: len(served_since(0)) >= 6, "steady load before the kill")
                pid = triton.process.pid if triton.process else 0
                triton.kill()  # SIGKILL to its process group; back once the server is reaped
                assert not Path(f"/proc/{pid}").exists()  # gone: nothing can answer from here
                # taken once the kill has taken effect, not before it (a request started in
                # between was served by the dying server: 200 "after the kill")
                killed_at = time.monotonic()
                wait_until(
                    lambda: any(o.started > killed_at and o.status >= 500 for o in list(outcomes)),
                    "the outage reaches the clients",
                )
                assert http.get("/healthz").status_code == 200
                down = wait_until(
                    lambda: (r := http.get("/readyz")).status_code == 503 and r, "unready"
                )
                assert int(down.headers["retry-after"]) >= 1
                # from here the new server may answer (it serves before start() has seen it
                # READY): the outage is what ended before this moment
                restarting_at = time.monotonic()
                # same ports: they stay reserved by the first server object until it is released
                restarted = LocalTriton(
                    cpu_repository, log_path=tmp_path / "triton-2.log", **ports
                ).start()
                restarted_at = time.monotonic()
                wait_until(lambda: served_since(restarted_at), "a request served after restart")
                recovered_at = min(o.ended for o in served_since(restarted_at))
                wait_until(lambda: http.get("/readyz").status_code == 200, "ready again")
                back = len(served_since(restarted_at))
                wait_until(lambda: len(served_since(restarted_at)) >= back + 6, "steady again")
                stop.set()
                for thread in threads:
                    thread.join(60)
    finally:
        stop.set()
        triton.stop()
        triton.release_ports()
        if restarted is not None:
            restarted.stop()
    # started once no server was left and ended before the next one was started: nothing could
    # have served them (those across the restart may be either)
    during = [o for o in outcomes if killed_at < o.started and o.ended < restarting_at]
    statuses = {o.status for o in outcomes}
    print(
        f"\nrequests {len(outcomes)}, statuses {sorted(statuses)}, outage answers "
        f"{sorted({o.status for o in during})}, "
        f"slowest {max(o.ended - o.started for o in outcomes):.2f} s, "
        f"recovered {recovered_at - restarted_at:.2f} s after Triton was back"
    )
    assert failures == []  # every request got an answer: none hung past the deadline
    assert statuses <= {200, 502, 503, 504}
    assert during and all(o.status in (502, 503, 504) for o in during)
    assert all(o.correct for o in outcomes if o.status == 200)  # nothing mixed up
    # the restarted Triton had forgotten the gateway's shared-memory regions: re-registered
    assert "shared-memory input refused" in (tmp_path / "gateway.log").read_text()


def test_slow_loris_body_gets_408(triton, start_gateway) -> None:
    gateway = start_gateway(triton.grpc_url, GATEWAY_BODY_TIMEOUT_S="1")
    with socket.create_connection((gateway.host, gateway.port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100000\r\n\r\n{"input": ["'
        )
        reply = b""
        sock.settimeout(0.2)
        for _ in range(300):  # one byte every 200 ms: alive, but never done (60 s at most)
            sock.sendall(b"A")
            with contextlib.suppress(TimeoutError):
                reply = sock.recv(4096)
            if reply:
                break
    assert reply.startswith(b"HTTP/1.1 408"), reply[:100]
    assert b"application/problem+json" in reply
    assert httpx.get(f"{gateway.url}/healthz").status_code == 200


def test_thousands_of_tiny_parts(gateway: GatewayProcess) -> None:
    many = [("image", (f"{i}", b"x", "image/jpeg")) for i in range(5000)]
    response = httpx.post(f"{gateway.url}/v1/embeddings", files=many, timeout=60)
    assert response.status_code == 413
    assert response.headers["content-type"].startswith("application/problem+json")


def test_deeply_progressive_jpeg_is_refused_before_decoding(gateway: GatewayProcess) -> None:
    data = samples.progressive_jpeg(1, (800, 600))
    first = data.index(b"\xff\xda")
    second = data.index(b"\xff\xda", first + 2)
    bomb = data[:second] + data[first:second] * 300 + data[second:]
    response = httpx.post(f"{gateway.url}/v1/embeddings", files=files(bomb), timeout=30)
    assert response.status_code == 422
    assert "scans" in response.json()["detail"]


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics"])
def test_probes_still_answer_after_a_run_of_rejections(gateway: GatewayProcess, path: str) -> None:
    """Rejected requests leave nothing behind that a probe would trip over: each is a 422
    counted once, and the probe that follows answers 200."""
    from tests.metrics import sample_or_zero

    name, reason = "gateway_rejected_requests_total", {"reason": "invalid-image"}
    before = sample_or_zero(httpx.get(f"{gateway.url}/metrics").text, name, **reason)
    statuses = {
        httpx.post(f"{gateway.url}/v1/embeddings", files=files(b"junk"), timeout=30).status_code
        for _ in range(20)
    }
    assert statuses == {422}
    probe = httpx.get(f"{gateway.url}{path}", timeout=30)
    assert probe.status_code == 200
    after = sample_or_zero(httpx.get(f"{gateway.url}/metrics").text, name, **reason)
    assert after - before == 20


def test_idle_and_trickling_connections_cannot_hold_slots(triton, start_gateway) -> None:
    """With every slot taken by connections that never finish a request head, new clients are
    refused (503) only until the head deadline closes them (408); then service resumes."""
    gateway = start_gateway(
        triton.grpc_url,
        GATEWAY_HEADER_TIMEOUT_S="1",
        GATEWAY_MAX_CONNECTIONS="4",
        GATEWAY_CANARY_INTERVAL_S="0",
    )
    hogs = [socket.create_connection((gateway.host, gateway.port), timeout=30) for _ in range(4)]
    try:
        hogs[2].sendall(b"POST /v1/embeddings HTTP/1.1\r\nHo")  # a head that never ends
        hogs[3].sendall(b"GET /hea")
        refused: list[httpx.Response] = []

        def slots_taken() -> bool:
            refused.append(httpx.get(f"{gateway.url}/healthz"))
            return refused[-1].status_code == 503

        wait_until(slots_taken, "the slots are taken")
        # uvicorn's own refusal, replaced (clip_gateway/http/connections.py): problem+json, and
        # when to retry computed from this worker's backlog (nothing admitted here: the 1 s floor)
        assert refused[-1].headers["content-type"] == "application/problem+json"
        assert refused[-1].headers["retry-after"] == "1"
        assert refused[-1].json()["status"] == 503
        replies = []
        for sock in hogs:
            reply = b""
            while chunk := sock.recv(4096):  # the server answers and closes
                reply += chunk
            replies.append(reply)
    finally:
        for sock in hogs:
            sock.close()
    assert all(r.startswith(b"HTTP/1.1 408") for r in replies), replies
    assert all(b"application/problem+json" in r for r in replies)
    wait_until(lambda: httpx.get(f"{gateway.url}/healthz").status_code == 200, "slots freed")
