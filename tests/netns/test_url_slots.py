"""Fetch slots that hold, and a deadline that bounds the fetches (issue 42), against a real
gateway process in the namespace: the per-worker cap holds however many requests arrive at
once (counted by the server, as connections it holds open), one request of dead links leaves
the other clients' URL requests served, and it is answered within its deadline.

Settings sized for a test: fetches time out in 2 s, requests in 6 s (the admission horizon is
half of it, so URLs are fetched for 3 s), 32 fetch slots per worker, 8 per request. Before the
fix, 16 requests of 32 stalled URLs had 512 fetches in flight at once; while one request held
256 dead links every other client's one-URL request got 429, and it was answered after 16 s."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from clip_gateway.config.processes import GatewayProcess
from tests.netns.images import Images, gateway, serving

FETCH_TIMEOUT_S, REQUEST_TIMEOUT_S, SLOTS = 2.0, 6.0, 32


@pytest.fixture(scope="module")
def server() -> Iterator[Images]:
    with serving() as images:
        yield images


@pytest.fixture(scope="module")
def process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    env = {
        "GATEWAY_URL_TIMEOUT_S": str(FETCH_TIMEOUT_S),
        "GATEWAY_URL_CONNECT_TIMEOUT_S": "1",
        "GATEWAY_REQUEST_TIMEOUT_S": str(REQUEST_TIMEOUT_S),
        "GATEWAY_URL_MAX_FETCHES": str(SLOTS),
        "GATEWAY_URL_FETCHES_PER_REQUEST": "8",
        "GATEWAY_MAX_ITEMS_PER_REQUEST": "256",
        "GATEWAY_MAX_CONNECTIONS": "0",
    }
    with gateway(tmp_path_factory.mktemp("slots"), **env) as running:
        yield running


def post(process: GatewayProcess, urls: list[str], **options: object) -> httpx.Response:
    body = {"input": [{"image": url} for url in urls], **options}
    return httpx.post(f"{process.url}/v1/embeddings", json=body, timeout=60)


def timed(call: object) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = call()  # type: ignore[operator]
    return response, time.monotonic() - started


def at_once(process: GatewayProcess, bodies: list[bytes]) -> list[tuple[int, float]]:
    """``bodies`` posted on connections of their own, arriving together: each is sent but for
    its last byte, then the last bytes one after another, so the gateway reads the requests'
    ends in the same turn of its event loop; each answer's status and seconds from then."""
    connections = [socket.create_connection((process.host, process.port)) for _ in bodies]
    for connection, body in zip(connections, bodies, strict=True):
        head = (f"POST /v1/embeddings HTTP/1.1\r\nHost: gateway\r\nContent-Type: "
                f"application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()  # fmt: skip
        connection.sendall(head + body[:-1])
    time.sleep(0.3)  # the heads are read (a wait, not a bound: late or early, the cap must hold)
    started = time.monotonic()
    for connection, body in zip(connections, bodies, strict=True):
        connection.sendall(body[-1:])
    answers = []
    for connection in connections:
        with connection, connection.makefile("rb") as answer:
            connection.settimeout(60)
            status = int(answer.readline().split()[1])
            answers.append((status, time.monotonic() - started))
    return answers


def test_the_slot_cap_holds_with_16_requests_of_32_stalled_urls(
    process: GatewayProcess, server: Images
) -> None:
    server.reset()
    body = json.dumps({"input": [{"image": f"{server.url}/stall"}] * 32}).encode()
    answers = at_once(process, [body] * 16)
    statuses = sorted(status for status, _ in answers)
    print(f"figures: 16 x 32 stalled URLs at once: {server.peak_held} fetches in flight at most "
          f"(cap {SLOTS}); statuses {statuses}; slowest answer "
          f"{max(s for _, s in answers):.2f} s")  # fmt: skip
    assert server.peak_held <= SLOTS, (server.peak_held, statuses)
    assert server.peak_held >= 8  # the requests that got slots did fetch
    # each fetch timed out (422, naming it), or the request found no slot free (429, at once)
    assert set(statuses) <= {422, 429}, statuses
    assert max(seconds for _, seconds in answers) < REQUEST_TIMEOUT_S + 1


def test_dead_links_leave_other_clients_served_and_end_by_the_deadline(
    process: GatewayProcess, server: Images
) -> None:
    dead: list[tuple[httpx.Response, float]] = []
    holder = threading.Thread(target=lambda: dead.append(timed(
        lambda: post(process, [f"{server.url}/stall"] * 256, skip_invalid=True)
    )))  # fmt: skip
    holder.start()
    while server.held < 8 and holder.is_alive():  # the dead request holds its slots
        time.sleep(0.01)
    others: list[tuple[httpx.Response, float]] = []

    def client(n: int) -> None:
        while holder.is_alive():
            others.append(timed(lambda: post(process, [f"{server.url}/img/{n}"])))
            time.sleep(0.05)

    with ThreadPoolExecutor(6) as pool:
        list(pool.map(client, range(6)))
    holder.join()
    response, seconds = dead[0]
    waits = sorted(s for _, s in others)
    print(f"figures: 256 dead links answered {response.status_code} in {seconds:.2f} s (deadline "
          f"{REQUEST_TIMEOUT_S:g} s); meanwhile {len(others)} one-URL requests from 6 other "
          f"clients: {sorted({r.status_code for r, _ in others})}, median "
          f"{waits[len(waits) // 2]:.3f} s, slowest {waits[-1]:.3f} s (fetch timeout "
          f"{FETCH_TIMEOUT_S:g} s)")  # fmt: skip
    assert response.status_code == 200, response.text[:300]
    errors = response.json()["errors"]
    assert len(errors) == 256 and {e["status"] for e in errors} == {422}
    assert any("request's deadline" in e["detail"] for e in errors)  # cut at the window
    assert seconds < REQUEST_TIMEOUT_S + 1, seconds
    assert others, "no other client was served while the dead links were held"
    assert [r.status_code for r, _ in others] == [200] * len(others)
    assert max(s for _, s in others) < FETCH_TIMEOUT_S + 1, max(s for _, s in others)


def test_a_request_of_slow_urls_is_answered_within_its_deadline(
    process: GatewayProcess, server: Images
) -> None:
    """Each URL answers within the fetch timeout, but one after another they take longer than
    the request may: the ones not fetched in the window are refused as late, the request is
    answered in time, and without skip_invalid the refusal names the first of them."""
    slow = [f"{server.url}/slow-img?1.2"] * 24  # three rounds of 8: 3.6 s of a 3 s window
    for skip in (True, False):
        response, seconds = timed(lambda: post(process, slow, skip_invalid=skip))  # noqa: B023
        print(f"figures: 24 URLs of 1.2 s each, skip_invalid={skip}: {response.status_code} in "
              f"{seconds:.2f} s (deadline {REQUEST_TIMEOUT_S:g} s)")  # fmt: skip
        assert seconds < REQUEST_TIMEOUT_S + 1, seconds
        if skip:
            assert response.status_code == 200
            body = response.json()
            assert len(body["data"]) >= 8 and len(body["data"]) + len(body["errors"]) == 24
            assert all(e["detail"].endswith("answer sooner") for e in body["errors"])
        else:
            assert response.status_code == 422
            assert response.json()["rule"] == "deadline"
