"""Request heads bounded by the gateway's uvicorn protocol (http/connections.py), on a real
uvicorn server in this process with an echo app: the limits are exact, a refused head gets a
whole problem+json answer before the connection closes, and what is within them (keep-alive,
pipelining, large bodies) is served as before. The gateway process: tests/integration/test_edge.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import uvicorn

from clip_gateway.http.connections import DeadlineProtocol, HeadLimits, protocol

HEAD_BYTES, FIELDS = 4096, 12


async def echo(scope, receive, send) -> None:
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})


@contextlib.contextmanager
def serving(
    http: Callable[..., DeadlineProtocol], app: Callable[..., Any] = echo, **config: Any
) -> Iterator[tuple[str, int]]:
    """``app`` (the echo app) on a real uvicorn server in a thread of this process, on a free
    port."""
    sock = socket.create_server(("127.0.0.1", 0))
    server = uvicorn.Server(
        uvicorn.Config(app, http=http, log_level="error", lifespan="off", **config)  # type: ignore[arg-type]
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]})
    thread.start()
    while not server.started:
        threading.Event().wait(0.01)
    try:
        yield sock.getsockname()[:2]
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@pytest.fixture(scope="module")
def address() -> Iterator[tuple[str, int]]:
    limits = HeadLimits(max_head_bytes=HEAD_BYTES, max_header_fields=FIELDS)
    with serving(protocol(limits)) as address:
        yield address


def exchange(
    address: tuple[str, int], raw: bytes, step: int = 1 << 16, *, half_close: bool = True
) -> bytes:
    """Send ``raw`` in ``step``-byte writes (until the server stops reading), then read until
    the server closes. ``half_close=False``: no end-of-file after the writes (uvicorn closes a
    half-closed connection as soon as it reads that, before answering what it has queued)."""
    with socket.create_connection(address) as sock:
        sock.settimeout(10)
        try:
            for at in range(0, len(raw), step):
                sock.sendall(raw[at : at + step])
            if half_close:
                sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def get(headers: bytes = b"", target: bytes = b"/") -> bytes:
    return b"GET " + target + b" HTTP/1.1\r\nHost: t\r\n" + headers + b"\r\n"


def refused(answer: bytes, status: int, words: str) -> None:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d " % status), answer[:200]
    lowered = head.lower()
    assert b"content-type: application/problem+json" in lowered
    assert b"connection: close" in lowered
    problem = json.loads(body)
    assert problem["status"] == status and words in problem["detail"], problem


def test_a_head_of_exactly_the_limit_is_served_and_one_byte_more_is_431(
    address: tuple[str, int],
) -> None:
    base = len(get(b"X-Pad: \r\n"))
    exact = get(b"X-Pad: " + b"a" * (HEAD_BYTES - base) + b"\r\n")
    assert len(exact) == HEAD_BYTES
    assert exchange(address, exact).startswith(b"HTTP/1.1 200 ")
    over = get(b"X-Pad: " + b"a" * (HEAD_BYTES - base + 1) + b"\r\n")
    refused(exchange(address, over), 431, f"request line and headers over {HEAD_BYTES} bytes")


@pytest.mark.parametrize(
    "raw",
    [
        get(b"X-Big: " + b"a" * (8 << 20) + b"\r\n"),  # one huge header, fed in 64 KiB reads
        get(b"".join(b"X-%d: " % i + b"a" * 1000 + b"\r\n" for i in range(10))),  # few, long
        get(target=b"/?q=" + b"a" * (1 << 20)),  # a huge request line
        b"GET /" + b"a" * (1 << 20),  # a request line that never ends
    ],
    ids=["one-huge-header", "long-headers", "huge-url", "endless-line"],
)
def test_heads_over_the_byte_limit_are_431_whatever_their_shape(
    address: tuple[str, int], raw: bytes
) -> None:
    refused(exchange(address, raw), 431, f"over {HEAD_BYTES} bytes")


def test_one_header_field_too_many_is_431(address: tuple[str, int]) -> None:
    fields = lambda n: b"".join(b"X-%d: v\r\n" % i for i in range(n))  # noqa: E731
    assert exchange(address, get(fields(FIELDS - 1))).startswith(b"HTTP/1.1 200 ")  # + Host
    refused(exchange(address, get(fields(FIELDS))), 431, f"more than {FIELDS} header fields")


def test_bytes_that_are_not_http_are_a_problem_400(address: tuple[str, int]) -> None:
    folded = get(b"X-Folded: a\r\n continued\r\n")  # obs-fold (RFC 9112 section 5.2)
    refused(exchange(address, folded), 400, "not valid HTTP/1.1")
    refused(exchange(address, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"), 400, "not valid")


def test_bodies_keep_alive_and_pipelining_are_not_heads(address: tuple[str, int]) -> None:
    """A body many times the head limit, then a second request on the same connection in the
    same writes (pipelined): both answered, the second head counted afresh."""
    body = b"z" * (16 * HEAD_BYTES)
    post = b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    pad = b"X-Pad: " + b"a" * (HEAD_BYTES - 200) + b"\r\n"
    answer = exchange(
        address, post + get(pad + b"Connection: close\r\n"), step=len(post) + 50, half_close=False
    )
    assert answer.count(b"HTTP/1.1 200 ") == 2, answer[:300]
    assert body in answer


def test_two_servers_in_one_process_answer_the_connection_limit_each_with_its_own_retry_after() -> (
    None
):
    """Each app's connections carry its own limits and Retry-After (passed to the protocol, no
    class state): with a limit of one connection every request is past it, and each server
    answers 503 with the seconds its own source gives."""
    limits = HeadLimits(max_head_bytes=HEAD_BYTES, max_header_fields=FIELDS)
    with (
        serving(protocol(limits, lambda: 6.2), limit_concurrency=1) as first,
        serving(protocol(HeadLimits(), lambda: 42.0), limit_concurrency=1) as second,
    ):
        for address, wait in ((first, 7), (second, 42)):
            answer = exchange(address, get(b"Connection: close\r\n"))
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 503 ")
            assert f"retry-after: {wait}".encode() in head.lower()
            assert json.loads(body)["detail"].endswith(f"retry after {wait} s")


def test_each_worker_app_gets_a_protocol_bound_to_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gateway's uvicorn config (http/app.py ServerConfig): loading it builds the app and a
    protocol factory with that app's head limits and Retry-After source; two loaded in one
    process keep their own."""
    from litestar import Litestar

    from clip_gateway.http.app import ServerConfig

    made = []
    for fields in ("20", "30"):
        monkeypatch.setenv("GATEWAY_MAX_HEADER_FIELDS", fields)
        config = ServerConfig("clip_gateway.http.app:create_app", factory=True, lifespan="off")
        config.load()
        made.append(config.http_protocol_class)
    limits = [factory.keywords["limits"] for factory in made]  # type: ignore[attr-defined]
    assert [limit.max_header_fields for limit in limits] == [20, 30]
    sources = [factory.keywords["retry_after_s"] for factory in made]  # type: ignore[attr-defined]
    apps = [source.args[0] for source in sources]
    assert all(isinstance(app, Litestar) for app in apps) and apps[0] is not apps[1]
    assert [source() for source in sources] == [1.0, 1.0]  # before a lifespan built a pipeline


async def slow_or_big(scope, receive, send) -> None:
    """``/slow``: the echo after half a second; ``/big``: 16 MiB (more than a loopback socket
    buffers)."""
    if scope["type"] != "http":
        return
    if scope["path"] == "/slow":
        await asyncio.sleep(0.5)
        await echo(scope, receive, send)
        return
    body = b"b" * (16 << 20)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})


@contextlib.contextmanager
def serving_app(app: Any, limits: HeadLimits) -> Iterator[tuple[str, int]]:
    sock = socket.create_server(("127.0.0.1", 0))
    config = uvicorn.Config(app, http=protocol(limits), log_level="error", lifespan="off")  # type: ignore[arg-type]
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]})
    thread.start()
    while not server.started:
        threading.Event().wait(0.01)
    try:
        yield sock.getsockname()[:2]
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (get(b"Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
             b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"), "(Upgrade: 'websocket')"),
        (b"POST / HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
         b"Content-Length: 5\r\n\r\nhello", "(Upgrade: 'websocket')"),
        (b"POST / HTTP/1.1\r\nHost: t\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
         b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\nContent-Length: 5\r\n\r\nhello",
         "(Upgrade: 'h2c')"),
        (b"CONNECT /x HTTP/1.1\r\nHost: t\r\n\r\n", "CONNECT asks for a tunnel"),
    ],
    ids=["websocket", "websocket-with-body", "h2c-with-body", "connect"],
)  # fmt: skip
def test_a_protocol_switch_is_a_400_at_once_and_the_connection_closed(
    address: tuple[str, int], raw: bytes, words: str
) -> None:
    """uvicorn's WebSocket protocol is there (``ws`` auto, as the test server has it) and still
    never takes the connection: the refusal comes first."""
    refused(exchange(address, raw, half_close=False), 400, words)


@pytest.mark.slow
def test_an_answer_not_taken_in_time_resets_the_connection() -> None:
    """A client that asks for 16 MiB and reads none of it: once the server's buffer is full it
    has ``answer_timeout_s`` to take the rest, then the connection is reset (nothing waits for
    a reader that never comes). A client that reads gets all of it (within the default 30 s)."""
    with serving_app(slow_or_big, HeadLimits()) as address:
        answer = exchange(address, get(b"Connection: close\r\n", target=b"/big"))
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"b" * (16 << 20))
    with (
        serving_app(slow_or_big, HeadLimits(answer_timeout_s=0.5)) as address,
        socket.create_connection(address) as sock,
    ):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(get(target=b"/big"))
        threading.Event().wait(3.0)  # well past the deadline, reading nothing
        sock.settimeout(10)
        received, reset = b"", False
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except ConnectionResetError:
            reset = True
        assert reset and received.startswith(b"HTTP/1.1 200 ") and len(received) < 16 << 20


def test_a_refusal_pipelined_behind_a_response_follows_it() -> None:
    """A request refused (here: a protocol switch) while the response before it on the
    connection is still being made: the refusal waits for that response, so the client never
    reads it as the first one's answer."""
    switch = get(b"Connection: Upgrade\r\nUpgrade: websocket\r\n")
    with serving_app(slow_or_big, HeadLimits()) as address:
        answer = exchange(address, get(target=b"/slow") + switch, half_close=False)
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:300]
    assert answer.partition(b"\r\n\r\n")[2].startswith(b"HTTP/1.1 400 "), answer[:300]


def test_the_gateways_server_has_no_websocket_protocol() -> None:
    """No route is a WebSocket endpoint: uvicorn's WebSocket protocol, when it took an upgrade,
    took it past every head and body deadline."""
    from clip_gateway.http.app import ServerConfig

    config = ServerConfig("clip_gateway.http.app:create_app", factory=True, lifespan="off")
    config.load()
    assert config.ws_protocol_class is None


async def slow_echo(scope, receive, send) -> None:
    """The echo app, taking its time over each chunk, as the gateway does while it parses: the
    body piles up in the protocol, which pauses reading past uvicorn's high-water mark."""
    if scope["type"] != "http":
        return
    chunks: list[bytes] = []
    while True:
        message = await receive()
        assert type(message["body"]) is bytes  # what the body readers take (http/body.py)
        chunks.append(message["body"])
        await asyncio.sleep(0.002)
        if not message.get("more_body"):
            break
    body = b"".join(chunks)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})


def test_a_body_kept_without_uvicorns_copies_arrives_whole_and_in_order() -> None:
    """A body chunk is handed on as the parser's own bytes (no bytearray and second copy): 3 MiB
    of distinct bytes, sent in odd-sized writes to a slow reader, come back byte for byte."""
    body = bytes(range(256)) * (3 * 4096)
    raw = (b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
           % len(body)) + body  # fmt: skip
    with serving(protocol(HeadLimits()), slow_echo) as address:
        answer = exchange(address, raw, step=7919, half_close=False)
    head, _, echoed = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), head
    assert echoed == body


def test_a_body_chunk_that_arrives_alone_reaches_the_app_uncopied() -> None:
    """The bytes httptools handed the protocol are the bytes the app receives (uvicorn's own
    on_body appends them to a bytearray and copies that again for receive)."""
    parsed: list[bytes] = []  # every chunk the parser handed over, kept alive (ids stay unique)
    received: list[bytes] = []

    class Recording(DeadlineProtocol):
        def on_body(self, body: bytes) -> None:
            parsed.append(body)
            super().on_body(body)

    async def keep(scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        while True:
            message = await receive()
            received.append(message["body"])
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    body = b"x" * (1 << 20)
    raw = (
        b"POST / HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body)
        + body
    )
    http = functools.partial(Recording, limits=HeadLimits())
    with serving(http, keep) as address:
        answer = exchange(address, raw, step=1 << 14, half_close=False)
    assert answer.startswith(b"HTTP/1.1 204 "), answer[:100]
    assert b"".join(received) == body
    assert any(any(chunk is got for chunk in parsed) for got in received if got)
