"""An Immich ML server stand-in that misbehaves byte by byte: a raw asyncio server on loopback,
in a thread of the test process, writing each answer as literal bytes (no HTTP library on its
side decides what goes on the wire). What it does is chosen by the request's ``entries``:
``{"test": {"<behaviour>": {"modelName": "<id>"}}}`` (a task the gateway does not serve, so it
is forwarded unchanged), and the answers carry the request's ``<id>``, so a test can tell whose
answer a client got. It records every connection (opened, closed, requests read) so a test can
see when the gateway let go of one."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

#: ``entries`` as the tests send them: the behaviour and the request's id.
ENTRIES = re.compile(rb'\{"test": \{"([\w-]+)": \{"modelName": "([^"]*)"')
#: A 15 MiB answer (a JSON array of zeros).
BIG = b"[" + b"0," * ((15 << 20) // 2 - 1) + b"0]"


def entries(behaviour: str, ident: str) -> dict[str, object]:
    return {"test": {behaviour: {"modelName": ident}}}


def ok(ident: str) -> bytes:
    """The answer ``ok`` gives a request with this id, byte for byte."""
    return json.dumps({"id": ident}).encode()


def response(status: bytes, body: bytes, *headers: bytes) -> bytes:
    head = b"HTTP/1.1 " + status + b"\r\n" + b"".join(h + b"\r\n" for h in headers)
    return head + b"content-length: %d\r\n\r\n" % len(body) + body


def answer(ident: str) -> bytes:
    return response(b"200 OK", ok(ident), b"content-type: application/json")


#: The second response an upstream appends (it must never reach a client).
INTRUDER = answer("intruder")


@dataclass
class Connection:
    opened: float
    closed: float | None = None
    requests: int = 0


@dataclass
class RawUpstream:
    """The server; ``url`` once started. ``pings``: /ping requests seen; ``ping_s``: how long
    each /ping takes to be answered; ``hold_s``: how long ``slow`` waits before answering;
    ``early``: when set, every /predict is answered with these bytes as soon as its head is
    read, and the connection closed (the body never read)."""

    ping_s: float = 0.0
    hold_s: float = 3.0
    early: bytes | None = None
    url: str = ""
    connections: list[Connection] = field(default_factory=list)
    pings: int = 0
    loop: asyncio.AbstractEventLoop | None = None

    def closed_after(self, ident: str) -> Connection | None:
        """The connection that carried the request ``ident`` (None: never seen)."""
        return self._by_id.get(ident)

    def __post_init__(self) -> None:
        self._by_id: dict[str, Connection] = {}

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = Connection(time.monotonic())
        self.connections.append(connection)
        try:
            while True:
                request = await _read_request(reader, self)
                if request is None:
                    if self.early is not None:
                        writer.write(self.early)
                        await writer.drain()
                    break
                connection.requests += 1
                target, body = request
                if target == b"/ping":
                    self.pings += 1
                    await asyncio.sleep(self.ping_s)
                    writer.write(response(b"200 OK", b"pong", b"content-type: text/plain"))
                    await writer.drain()
                    continue
                found = ENTRIES.search(body)
                behaviour, ident = (found[1].decode(), found[2].decode()) if found else ("ok", "")
                self._by_id[ident] = connection
                await BEHAVIOURS[behaviour](self, ident, reader, writer)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            connection.closed = time.monotonic()
            writer.close()

    @contextmanager
    def running(self) -> Iterator[RawUpstream]:
        ready = threading.Event()
        stop: list[asyncio.Event] = []

        async def serve() -> None:
            server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
            self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
            self.loop = asyncio.get_running_loop()
            stop.append(asyncio.Event())
            ready.set()
            async with server:
                await stop[0].wait()

        thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
        thread.start()
        ready.wait(10)
        try:
            yield self
        finally:
            assert self.loop is not None
            self.loop.call_soon_threadsafe(stop[0].set)
            thread.join(10)


async def _read_request(
    reader: asyncio.StreamReader, upstream: RawUpstream
) -> tuple[bytes, bytes] | None:
    """One request's target and body (Content-Length or chunked); None at end of stream, or
    after the head of a /predict when an early answer is due."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head.split(b"\r\n")
    target = lines[0].split(b" ")[1]
    if upstream.early is not None and target == b"/predict":
        return None
    fields = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(b":") for ln in lines[1:])}
    if b"content-length" in fields:
        return target, await reader.readexactly(int(fields[b"content-length"]))
    body = b""
    if fields.get(b"transfer-encoding", b"").lower() == b"chunked":
        while size := int((await reader.readuntil(b"\r\n")).strip().split(b";")[0], 16):
            body += await reader.readexactly(size + 2)
            body = body[:-2]
        await reader.readuntil(b"\r\n")
    return target, body


Behaviour = Callable[
    [RawUpstream, str, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]
]
BEHAVIOURS: dict[str, Behaviour] = {}


def behaviour(name: str) -> Callable[[Behaviour], Behaviour]:
    def register(function: Behaviour) -> Behaviour:
        BEHAVIOURS[name] = function
        return function

    return register


def raw(name: str, data: Callable[[str], bytes]) -> None:
    """A behaviour that writes ``data(ident)`` as it is."""

    async def write(_: RawUpstream, ident: str, __: asyncio.StreamReader,
                    writer: asyncio.StreamWriter) -> None:  # fmt: skip
        writer.write(data(ident))

    BEHAVIOURS[name] = write


raw("ok", answer)
raw("append", lambda i: answer(i) + INTRUDER)
raw("chunked-extra", lambda i: b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    + b"%x\r\n" % len(ok(i)) + ok(i) + b"\r\n0\r\n\r\n" + INTRUDER)  # fmt: skip
raw("no-body-204", lambda i: b"HTTP/1.1 204 No Content\r\ncontent-length: 17\r\n\r\n"
    + b'{"id":"intruder"}')  # fmt: skip
raw("304-with-length", lambda i: b"HTTP/1.1 304 Not Modified\r\ncontent-length: 17\r\n\r\n"
    + b'{"id":"intruder"}')  # fmt: skip
raw("head-then-answer", lambda i: b"HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n" + answer(i))
raw("switching", lambda i: b"HTTP/1.1 101 Switching Protocols\r\nupgrade: x\r\n"
    b"connection: upgrade\r\n\r\n" + INTRUDER)  # fmt: skip
raw("http10-until-close", lambda i: b"HTTP/1.0 200 OK\r\ncontent-type: application/json\r\n\r\n"
    + ok(i))  # fmt: skip
raw("big", lambda i: response(b"200 OK", BIG, b"content-type: application/json"))
for code in (b"999", b"600", b"099", b"000", b"100", b"205"):
    raw(f"status-{code.decode()}", lambda i, code=code: response(code + b" X", ok(i)))
for label, value in {
    "utf8": "application/json; x=\u20ac".encode(),  # not latin-1 once decoded as UTF-8
    "obs-text": b"application/json; x=\xe9",  # one latin-1 byte (obs-text)
    "control": b"application/json; x=\x01",  # a control byte
    "delete": b"application/json; x=\x7f",
}.items():
    raw(f"content-type-{label}", lambda i, v=value: response(b"200 OK", ok(i),
                                                           b"content-type: " + v))  # fmt: skip
raw("retry-after-utf8", lambda i: response(b"503 Busy", ok(i), "retry-after: \u20ac".encode()))


@behaviour("close")
async def _close(_: RawUpstream, ident: str, __: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:  # fmt: skip
    writer.write(answer(ident)[:20])
    writer.close()


@behaviour("append-late")
async def _append_late(_: RawUpstream, ident: str, __: asyncio.StreamReader,
                       writer: asyncio.StreamWriter) -> None:  # fmt: skip
    """The answer, then a second one a moment later, while the connection is idle."""
    writer.write(answer(ident))
    await writer.drain()
    await asyncio.sleep(0.2)
    writer.write(INTRUDER)


@behaviour("pause")
async def _pause(_: RawUpstream, ident: str, __: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:  # fmt: skip
    await asyncio.sleep(0.5)
    writer.write(answer(ident))


@behaviour("slow")
async def _slow(upstream: RawUpstream, ident: str, reader: asyncio.StreamReader,
                writer: asyncio.StreamWriter) -> None:  # fmt: skip
    """Answers after ``hold_s``, unless the gateway hangs up first."""
    try:
        await asyncio.wait_for(reader.read(1), upstream.hold_s)
    except TimeoutError:
        writer.write(answer(ident))
        return
    raise ConnectionResetError  # the gateway closed the connection: recorded as closed
