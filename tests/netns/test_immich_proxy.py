"""The gateway as Immich's reverse proxy (``GATEWAY_IMMICH_UPSTREAM``, issue 43), tried byte by
byte, in a network namespace with only loopback: the real gateway process (``python -m
clip_gateway.http``: uvicorn, the gateway's HTTP protocol, the app) with an upstream that
misbehaves on the wire (tests/netns/raw_upstream.py) and clients on raw sockets. No Triton:
forwards never reach it.

Every answer the gateway makes itself is a problem naming what was wrong (a 4xx naming the
client's header or clock, a 502/503/504 naming the upstream), never a 500 or a closed
connection; every forward gets its own answer; a forward slot is held no longer than the
client's own clocks allow (its body, then taking the answer), and given back at once when the
client leaves. The clocks here are short (seconds); the bounds asserted are wide of them and
far below the upstream timeout a missing clock would have fallen back on.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from clip_gateway.config.processes import GatewayProcess
from clip_gateway.errors import BodyTooSlow
from clip_gateway.http.immich.upstream import Upstream
from tests.netns.raw_upstream import BIG, RawUpstream, entries, ok

HEADER_TIMEOUT_S = 5.0
BODY_TIMEOUT_S = 3.0
UPSTREAM_TIMEOUT_S = 20.0
CONCURRENCY = 4
BOUNDARY = "b0"
FORM = {"content-type": f"multipart/form-data; boundary={BOUNDARY}"}


@pytest.fixture(scope="module")
def upstream() -> Iterator[RawUpstream]:
    with RawUpstream(hold_s=2 * UPSTREAM_TIMEOUT_S).running() as server:
        yield server


@pytest.fixture(scope="module")
def gateway(
    upstream: RawUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    env = {
        "GATEWAY_IMMICH": "true",
        "GATEWAY_IMMICH_UPSTREAM": upstream.url,
        "GATEWAY_IMMICH_UPSTREAM_TIMEOUT_S": str(UPSTREAM_TIMEOUT_S),
        "GATEWAY_IMMICH_UPSTREAM_CONCURRENCY": str(CONCURRENCY),
        "GATEWAY_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
        "GATEWAY_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S),
        "GATEWAY_UPLOAD_GRACE_S": "1",
        "GATEWAY_MIN_UPLOAD_BYTES_PER_S": "100",
        "GATEWAY_CANARY_INTERVAL_S": "0",
        "GATEWAY_DECODE_THREADS": "1",
    }
    log = tmp_path_factory.mktemp("proxy") / "gateway.log"
    # nothing listens on port 1: the gateway's Triton is never reached by a forward
    with GatewayProcess("127.0.0.1:1", env=env, log_path=log) as process:
        yield process
    assert "Exception in ASGI application" not in log.read_text()
    assert "unhandled error" not in log.read_text()


def form(behaviour: str, ident: str, text: bytes = b"a photo", headers: bytes = b"") -> bytes:
    """A /predict form the gateway forwards (a task it does not serve), read by the upstream."""
    return (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="entries"\r\n'.encode()
        + headers
        + f"\r\n{json.dumps(entries(behaviour, ident))}\r\n--{BOUNDARY}\r\n"
        'Content-Disposition: form-data; name="text"\r\n\r\n'.encode()
        + text
        + f"\r\n--{BOUNDARY}--\r\n".encode()
    )


def predict(gateway: GatewayProcess, body: bytes, **headers: bytes | str) -> httpx.Response:
    """A forward on a connection of its own."""
    return httpx.post(f"{gateway.url}/predict", content=body, headers={**FORM, **headers},
                      timeout=60)  # fmt: skip


def head(length: int) -> bytes:
    return (
        f"POST /predict HTTP/1.1\r\nHost: gateway\r\nContent-Type: {FORM['content-type']}\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def in_flight(gateway: GatewayProcess) -> int:
    return int(httpx.get(f"{gateway.url}/immich/upstream", timeout=30).json()["forwards_in_flight"])


def wait_for(check: Callable[[], bool], within_s: float) -> float:
    """Seconds until ``check()`` held; fails past ``within_s``."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < within_s, "not within the bound"
        time.sleep(0.02)
    return time.monotonic() - start


def problem(response: httpx.Response, status: int, slug: str) -> str:
    assert response.status_code == status, (response.status_code, response.text[:300])
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert body["type"].endswith(f"/{slug}") and body["status"] == status
    return str(body["detail"])


def read_until_closed(sock: socket.socket, limit_s: float) -> tuple[bytes, float | None]:
    """What the server sent until it closed the connection, and when (None: still open at
    ``limit_s``)."""
    sock.settimeout(limit_s)
    start, data = time.monotonic(), b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        return data, None
    except ConnectionResetError:
        pass
    return data, time.monotonic() - start


# --- 1. never a 500 on bytes ------------------------------------------------------------------


#: What an upstream may answer that cannot go back as it came, and the words of the 502.
UNRELAYABLE = {
    "status-999": "status 999",
    "status-600": "status 600",
    "status-000": "did not speak HTTP",
    "status-099": "did not speak HTTP",
    "switching": "did not speak HTTP",  # a 101 nobody asked for
    "content-type-control": "content-type header holding the control byte 0x01",
    "content-type-delete": "content-type header holding the control byte 0x7f",
    "close": "closed the connection",
}


def test_an_answer_the_gateway_cannot_relay_is_a_502_naming_why(
    gateway: GatewayProcess, upstream: RawUpstream
) -> None:
    for behaviour, why in UNRELAYABLE.items():
        detail = problem(predict(gateway, form(behaviour, behaviour)), 502, "upstream-error")
        assert why in detail and "Immich's ML server" in detail, (behaviour, detail)
    # an upstream that answers before reading the body and hangs up: its answer comes back
    # while it fits in what was sent; a body it hung up on (its socket reset what it had not
    # read, the answer with it) is a 502 naming it
    upstream.early = b"HTTP/1.1 413 Too Large\r\ncontent-length: 4\r\n\r\nbig!"
    try:
        small = predict(gateway, form("ok", "early", text=b"x" * 10))
        assert small.status_code == 413 and small.content == b"big!"
        large = predict(gateway, form("ok", "early", text=b"x" * (1 << 20)))
        if large.status_code != 413:
            assert "Immich's ML server" in problem(large, 502, "upstream-error")
    finally:
        upstream.early = None


def test_header_bytes_that_can_be_relayed_come_back_as_they_came(gateway: GatewayProcess) -> None:
    for behaviour, value in {
        "content-type-utf8": "application/json; x=\u20ac".encode(),
        "content-type-obs-text": b"application/json; x=\xe9",
    }.items():
        response = predict(gateway, form(behaviour, behaviour))
        assert response.status_code == 200 and response.content == ok(behaviour)
        assert dict(response.headers.raw)[b"content-type"] == value


def test_an_upstream_retry_after_not_in_ascii_comes_back_as_sent(gateway: GatewayProcess) -> None:
    response = predict(gateway, form("retry-after-utf8", "r"))
    assert response.status_code == 503 and response.content == ok("r")  # the upstream's own
    assert dict(response.headers.raw)[b"retry-after"] == "\u20ac".encode()


@pytest.mark.parametrize(
    "value",
    [
        "multipart/form-data; boundary=b0; x=\u20ac".encode(),
        b"multipart/form-data; boundary=b0; x=\xe9",
    ],
)
def test_a_content_type_the_upstream_cannot_be_sent_is_a_400_naming_it(
    gateway: GatewayProcess, upstream: RawUpstream, value: bytes
) -> None:
    before = len(upstream.connections)
    detail = problem(predict(gateway, form("ok", "ct"), **{"content-type": value}), 400,
                     "invalid-request")  # fmt: skip
    assert "Content-Type header holds the byte 0x" in detail
    assert len(upstream.connections) == before  # refused before anything was forwarded


def test_a_content_type_given_twice_is_a_400(gateway: GatewayProcess) -> None:
    body = form("ok", "twice")
    with socket.create_connection((gateway.host, gateway.port)) as sock:
        twice = b"\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n"
        sock.sendall(head(len(body)).replace(b"\r\n\r\n", twice) + body)
        data, _ = read_until_closed(sock, 30)
    assert data.startswith(b"HTTP/1.1 400 ") and b"Content-Type header is given 2 times" in data


@pytest.mark.parametrize("accept", ["application/json; q=\u20ac".encode(), b"x\xe9"])
def test_an_accept_the_upstream_cannot_be_sent_is_dropped(
    gateway: GatewayProcess, accept: bytes
) -> None:
    response = predict(gateway, form("ok", "accept"), accept=accept)
    assert response.status_code == 200 and response.content == ok("accept")


def test_a_form_whose_first_part_the_router_cannot_read_is_forwarded(
    gateway: GatewayProcess,
) -> None:
    """More header lines in ``entries`` than the multipart parser takes: the router cannot
    read it, so the upstream answers it (it was a 500)."""
    extra = b"".join(b"X-%d: v\r\n" % i for i in range(12))
    response = predict(gateway, form("ok", "many-headers", headers=extra))
    assert response.status_code == 200 and response.content == ok("many-headers")
    long = b"X-Long: " + b"a" * 5000 + b"\r\n"
    response = predict(gateway, form("ok", "long-header", headers=long))
    assert response.status_code == 200 and response.content == ok("long-header")


# --- 2. one answer per forward -----------------------------------------------------------------


#: Upstreams that write past an answer, and whether the answer itself has a body.
STRAY_BYTES = {
    "append": True,  # a second response right after the first
    "append-late": True,  # ... a moment later, on the idle connection
    "chunked-extra": True,  # bytes after a chunked body's end
    "no-body-204": False,  # a 204 "with" a body: HTTP says it has none
    "304-with-length": False,
    "head-then-answer": True,  # a 103 first: not an answer
}


def test_bytes_past_an_answer_never_answer_another_forward(gateway: GatewayProcess) -> None:
    for behaviour, own in STRAY_BYTES.items():
        for n in range(2):
            first = predict(gateway, form(behaviour, f"{behaviour}-{n}"))
            assert first.content == (ok(f"{behaviour}-{n}") if own else b""), first.content[:200]
            time.sleep(0.3)  # "append-late": its second response arrives meanwhile
            for m in range(2):
                ident = f"after-{behaviour}-{n}-{m}"
                after = predict(gateway, form("ok", ident))
                assert after.status_code == 200 and after.content == ok(ident), (
                    behaviour, after.content[:200])  # fmt: skip


def test_concurrent_forwards_each_get_their_own_answer(gateway: GatewayProcess) -> None:
    kinds = ["append", "chunked-extra", "ok", "no-body-204", "append-late", "ok"]

    def one(n: int) -> tuple[str, int, bytes]:
        ident = f"mix-{n}"
        response = predict(gateway, form(kinds[n % len(kinds)], ident))
        return ident, response.status_code, response.content

    with ThreadPoolExecutor(CONCURRENCY) as pool:
        answers = list(pool.map(one, range(60)))
    for ident, status, content in answers:
        assert status in (200, 204, 503), (ident, status, content[:200])  # 503: upstream-busy
        if status == 200:
            assert content == ok(ident), (ident, content[:200])
        assert b"intruder" not in content
    assert sum(status == 200 for _, status, _ in answers) > 20


# --- 3. the client's clocks --------------------------------------------------------------------


def test_a_slow_body_is_408_naming_the_client_and_frees_its_slot(gateway: GatewayProcess) -> None:
    """Twice the minimum pace, so the pace alone never cuts it: the body timeout does, long
    before the upstream timeout (which answered 504 naming the upstream)."""
    body = form("ok", "slow-body", text=b"x" * 8000)
    stop = threading.Event()
    with socket.create_connection((gateway.host, gateway.port)) as sock:
        sock.sendall(head(len(body)) + body[:300])

        def trickle() -> None:
            for at in range(300, len(body), 40):
                if stop.wait(0.2):
                    return
                try:
                    sock.sendall(body[at : at + 40])
                except OSError:
                    return

        sender = threading.Thread(target=trickle)
        sender.start()
        try:
            start = time.monotonic()
            wait_for(lambda: in_flight(gateway) == 1, UPSTREAM_TIMEOUT_S)
            data, _ = read_until_closed(sock, 2 * UPSTREAM_TIMEOUT_S)
            took = time.monotonic() - start
        finally:
            stop.set()
            sender.join()
    assert data.startswith(b"HTTP/1.1 408 "), data[:300]
    assert b"request-timeout" in data and b"request body" in data
    assert took < UPSTREAM_TIMEOUT_S / 2
    assert in_flight(gateway) == 0


def test_the_upstream_timeout_while_the_client_is_slow_is_the_clients_408(
    upstream: RawUpstream,
) -> None:
    """An upstream timeout shorter than the body timeout: the forward runs out of time while
    it waits for the client's bytes, which is the client's slowness (408), not the upstream's."""

    async def stalled() -> object:
        yield b"--b0\r\n"
        await asyncio.sleep(3600)

    async def forward() -> None:
        proxy = Upstream([upstream.url], timeout_s=0.5, concurrency=1)
        try:
            await proxy.forward([(b"content-type", FORM["content-type"].encode())], stalled())
        finally:
            await proxy.aclose()

    with pytest.raises(BodyTooSlow, match="request body not received within"):
        asyncio.run(forward())


def test_a_client_that_leaves_cancels_its_forward_at_once(
    gateway: GatewayProcess, upstream: RawUpstream
) -> None:
    """The upstream holds its answer past the upstream timeout; the client leaves once the
    upstream has its request: the gateway lets go of the upstream connection and the slot
    within seconds, not at the upstream timeout."""
    body = form("slow", "departed")
    with socket.create_connection((gateway.host, gateway.port)) as sock:
        sock.sendall(head(len(body)) + body)
        wait_for(lambda: upstream.closed_after("departed") is not None, UPSTREAM_TIMEOUT_S)
        assert in_flight(gateway) == 1
    connection = upstream.closed_after("departed")
    assert connection is not None
    gone = wait_for(lambda: connection.closed is not None, 2 * UPSTREAM_TIMEOUT_S)
    assert gone < UPSTREAM_TIMEOUT_S / 4, gone
    assert in_flight(gateway) == 0


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def test_unread_answers_hold_their_slots_until_the_answer_deadline_then_go(
    gateway: GatewayProcess,
) -> None:
    """Clients that ask for a 15 MiB answer and never read it: each holds its slot (so their
    answers' memory is bounded by the slots), and is dropped once it has not taken the answer
    for the body timeout, which gives back the slot and the memory."""
    assert gateway.process is not None
    before = rss_mb(gateway.process.pid)
    sockets = []
    for n in range(CONCURRENCY + 2):
        sock = socket.create_connection((gateway.host, gateway.port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        body = form("big", f"unread-{n}")
        sock.sendall(head(len(body)) + body)
        sockets.append(sock)
    try:
        statuses = []
        for sock in sockets:
            sock.settimeout(UPSTREAM_TIMEOUT_S)
            statuses.append(sock.recv(12))
        assert sorted(statuses) == [b"HTTP/1.1 200"] * CONCURRENCY + [b"HTTP/1.1 503"] * 2
        assert in_flight(gateway) == CONCURRENCY  # held while the answers are not taken
        # the answer deadline (the body timeout, from the first stall) lets them go
        wait_for(lambda: in_flight(gateway) == 0, UPSTREAM_TIMEOUT_S)
        for sock, status in zip(sockets, statuses, strict=True):
            data, closed = read_until_closed(sock, UPSTREAM_TIMEOUT_S)
            assert closed is not None  # no connection left open
            if status.endswith(b"200"):
                assert len(data) < len(BIG)  # dropped, the rest unsent
    finally:
        for sock in sockets:
            sock.close()
    assert rss_mb(gateway.process.pid) - before < 30
    # a client that reads gets all of it
    response = predict(gateway, form("big", "read"))
    assert response.status_code == 200 and response.content == BIG
    assert in_flight(gateway) == 0


# --- 4. upstream health under load --------------------------------------------------------------


def test_concurrent_status_calls_share_a_ping_and_never_call_a_live_upstream_down(
    gateway: GatewayProcess, upstream: RawUpstream
) -> None:
    upstream.ping_s = 1.0  # a live upstream whose /ping takes a second
    try:
        before = upstream.pings
        with ThreadPoolExecutor(12) as pool:
            states = list(pool.map(
                lambda _: httpx.get(f"{gateway.url}/immich/upstream", timeout=60).json(),
                range(12)))  # fmt: skip
    finally:
        upstream.ping_s = 0.0
    assert [s["upstreams"][0]["state"] for s in states] == ["up"] * 12, states
    assert upstream.pings - before < 12


# --- 5. no connection without a deadline -------------------------------------------------------

SWITCHES = [
    b"GET / HTTP/1.1\r\nHost: g\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
    b"POST /predict HTTP/1.1\r\nHost: g\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
    b"Content-Type: multipart/form-data; boundary=b0\r\nContent-Length: 5\r\n\r\nhello",
    b"POST /predict HTTP/1.1\r\nHost: g\r\nConnection: Upgrade, HTTP2-Settings\r\n"
    b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\nContent-Length: 5\r\n\r\nhello",
    b"GET /ping HTTP/1.1\r\nHost: g\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
    b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n",
    b"CONNECT /predict HTTP/1.1\r\nHost: g\r\n\r\n",
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",  # HTTP/2 with prior knowledge
]


def test_fifty_protocol_switches_held_open_are_each_answered_within_the_head_timeout(
    gateway: GatewayProcess,
) -> None:
    """Every switch uvicorn could offer (WebSocket, h2c, CONNECT, HTTP/2's preface), with and
    without a body, on 50 connections the clients keep open: each is answered with a 400 that
    says why, and closed, within the head timeout."""
    results: list[tuple[bytes, float | None]] = [(b"", None)] * 50
    sockets = [socket.create_connection((gateway.host, gateway.port)) for _ in range(50)]

    def attempt(n: int) -> None:
        sockets[n].sendall(SWITCHES[n % len(SWITCHES)])
        results[n] = read_until_closed(sockets[n], HEADER_TIMEOUT_S)

    try:
        threads = [threading.Thread(target=attempt, args=(n,)) for n in range(50)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for sock in sockets:
            sock.close()
    for n, (data, closed) in enumerate(results):
        assert closed is not None, (n, data[:200])  # answered and closed in time
        status_line, _, rest = data.partition(b"\r\n")
        assert status_line == b"HTTP/1.1 400 Bad Request", (n, data[:300])
        detail = json.loads(rest.partition(b"\r\n\r\n")[2])["detail"]
        if b"Upgrade: " in SWITCHES[n % len(SWITCHES)]:
            assert "asks to switch protocols (Upgrade: " in detail, detail
    assert httpx.get(f"{gateway.url}/ping").text == "pong"
    # an Upgrade header without Connection: upgrade is no switch (HTTP says a sender lists it
    # there): served as it is, body and all, and the header is not forwarded
    response = predict(gateway, form("ok", "plain-upgrade"), upgrade="websocket")
    assert response.status_code == 200 and response.content == ok("plain-upgrade")


def test_a_switch_pipelined_behind_a_forward_is_answered_after_it(gateway: GatewayProcess) -> None:
    body = form("pause", "pipelined")
    with socket.create_connection((gateway.host, gateway.port)) as sock:
        sock.sendall(head(len(body)) + body + SWITCHES[0])
        data, closed = read_until_closed(sock, UPSTREAM_TIMEOUT_S)
    assert closed is not None
    first, _, second = data.partition(ok("pipelined"))
    assert first.startswith(b"HTTP/1.1 200 ") and second.startswith(b"HTTP/1.1 400 "), data
