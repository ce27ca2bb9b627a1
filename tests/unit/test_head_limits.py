"""Request heads bounded by the gateway's uvicorn protocol (http/connections.py), on a real
uvicorn server in this process with an echo app: the limits are exact, a refused head gets a
whole problem+json answer before the connection closes, and what is within them (keep-alive,
pipelining, large bodies) is served as before. The gateway process: tests/integration/test_edge.py.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator

import pytest
import uvicorn

from clip_gateway.http.connections import DeadlineProtocol

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


@pytest.fixture(scope="module")
def address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    limits = DeadlineProtocol.max_head_bytes, DeadlineProtocol.max_header_fields
    DeadlineProtocol.max_head_bytes, DeadlineProtocol.max_header_fields = HEAD_BYTES, FIELDS
    sock = socket.create_server(("127.0.0.1", 0))
    server = uvicorn.Server(
        uvicorn.Config(echo, http=DeadlineProtocol, log_level="error", lifespan="off")
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]})
    thread.start()
    while not server.started:
        threading.Event().wait(0.01)
    yield sock.getsockname()[:2]
    server.should_exit = True
    thread.join(10)
    sock.close()
    DeadlineProtocol.max_head_bytes, DeadlineProtocol.max_header_fields = limits


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
