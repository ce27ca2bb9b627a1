"""uvicorn's HTTP protocol with a deadline and a size limit on the request head.

uvicorn closes idle keep-alive connections, but a connection that sends nothing, or a request
line and headers a byte at a time, holds its slot for ever (any byte cancels the keep-alive
timer), so a few hundred slow clients starve everyone else once ``limit_concurrency`` is
reached. Here every request head (request line and headers) must be complete within
``header_timeout_s`` of the connection opening or the request starting; otherwise the client gets
408 and the connection is closed. The body has its own deadline (``GATEWAY_BODY_TIMEOUT_S``).

httptools puts no bound on a head either: it joins the pieces of a header (and uvicorn those of
the URL) by concatenation until the head ends, so one connection sending a 114 MB header until
the deadline cost ~10 CPU-seconds and +210 MB. Here the parser is fed at most ``max_head_bytes``
of a head, and at most ``max_header_fields`` header fields are taken; past either the client
gets 431 and the connection is closed, whatever the shape (one long header, many short ones, a
long request line, folded continuation lines). A head is counted from the first read that holds
it; a pipelined request's bytes that arrived with the previous one (one read at most) are not.

No request switches protocols here: no route is a WebSocket (or any other) endpoint, and
httptools stops parsing a connection once a request asks to switch (``Connection: upgrade``
with ``Upgrade``, or ``CONNECT``), so whatever followed its head (its body, the next request)
would never be read, and no head or body deadline would apply to the connection again. Such a
request is answered at once with a 400 naming what it asked for, and the connection is closed;
the server's WebSocket protocol is off (``app.ServerConfig``).

An answer the client stops reading (the connection's buffer over its high-water mark) must be
taken within ``answer_timeout_s`` of the first stall (the body timeout: the client's clock);
otherwise the connection is dropped with what is left unsent, so no client holds a slot, or
the memory of an answer, by not reading it. A closing answer made while another response on the
connection is still on its way (a pipelined request) follows that response, never precedes it.

Past ``GATEWAY_MAX_CONNECTIONS`` uvicorn answers 503 from an ASGI app of its own that says
nothing of when to retry; every 503 of this gateway carries a computed ``Retry-After``, so each
connection answers with its own (``_connection_limit``) instead.

Each connection gets its limits and its Retry-After source as arguments (``protocol``: the
factory uvicorn calls per connection), never from class or module state, so two apps served
in one process keep their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import math
import socket
import struct
from asyncio import TimerHandle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT, service_unavailable
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from clip_gateway.config.settings import ServerSettings


def _closing_answer(status: int, reason: str, slug: str, title: str, detail: str) -> bytes:
    """A whole problem+json response that closes the connection, for answers made before any
    request exists (the app never sees these)."""
    body = json.dumps(
        {
            "type": f"https://clip-gateway.dev/problems/{slug}",
            "title": title,
            "status": status,
            "detail": detail,
        },
        separators=(",", ":"),
    ).encode()
    return (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/problem+json\r\n"
        f"connection: close\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode() + body


_TIMEOUT = _closing_answer(
    408,
    "Request Timeout",
    "request-timeout",
    "Request head too slow",
    "the request line and headers did not arrive in time",
)


#: Seconds a refused connection is drained (bytes dropped unread) before it is closed.
LINGER_S = 1.0


class _HeadRefused(Exception):
    """Raised inside a parser callback to stop parsing a head already answered."""


@dataclass(frozen=True)
class HeadLimits:
    """What a request head may take (the settings' ``header_timeout_s``, ``max_head_bytes``,
    ``max_header_fields``), and how long an answer may wait for its client to read it (the
    settings' ``body_timeout_s``)."""

    #: Seconds a request head may take.
    header_timeout_s: float = 10.0
    #: Bytes a request head (request line and headers) may take.
    max_head_bytes: int = 64 << 10
    #: Header fields one request may carry.
    max_header_fields: int = 100
    #: Seconds a client may take to read the rest of an answer once it has stopped keeping up.
    answer_timeout_s: float = 30.0

    @classmethod
    def of(cls, settings: ServerSettings) -> HeadLimits:
        return cls(
            settings.header_timeout_s,
            settings.max_head_bytes,
            settings.max_header_fields,
            settings.body_timeout_s,
        )


def _one_second() -> float:
    return 1.0


def protocol(
    limits: HeadLimits, retry_after_s: Callable[[], float] = _one_second
) -> Callable[..., DeadlineProtocol]:
    """uvicorn's ``http`` protocol factory for one app: every connection it makes holds these
    head limits, and past the connection limit answers with ``retry_after_s()`` (that app's
    admitted backlog: connections free as that work finishes)."""
    return functools.partial(DeadlineProtocol, limits=limits, retry_after_s=retry_after_s)


class DeadlineProtocol(HttpToolsProtocol):
    def __init__(
        self,
        *args: Any,
        limits: HeadLimits,
        retry_after_s: Callable[[], float] = _one_second,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        self.retry_after_s = retry_after_s
        self._head_deadline: TimerHandle | None = None
        #: Bytes of the current head fed to the parser; None while a body is being read.
        self._head_bytes: int | None = 0
        self._header_fields = 0
        self._refused = False
        #: A closing answer waiting for the response on its way to be sent first.
        self._deferred: bytes | None = None
        self._answer_deadline: TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        """Feed the parser, at most ``limits.max_head_bytes`` of any one head: a head not complete
        by then is refused before httptools or uvicorn has joined more of it."""
        view = memoryview(data)  # once refused: dropped unread until the connection closes
        while view and not self._refused and not self.transport.is_closing():
            if self._head_bytes is None:  # a body: the parser takes it as it comes
                super().data_received(view)  # type: ignore[arg-type]
                return
            room = self.limits.max_head_bytes - self._head_bytes
            piece, view = view[:room], view[room:]
            self._head_bytes += len(piece)
            super().data_received(piece)  # type: ignore[arg-type]
            if self._head_bytes is not None and self._head_bytes >= self.limits.max_head_bytes:
                self._refuse(f"request line and headers over {self.limits.max_head_bytes} bytes")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_fields = 0
        if self._head_deadline is None:
            self._arm()

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_fields += 1
        if self._header_fields > self.limits.max_header_fields:
            self._refuse(f"more than {self.limits.max_header_fields} header fields")
            raise _HeadRefused  # stops the parser: this request never starts
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._disarm()
        self._head_bytes = None
        if self.parser.should_upgrade():
            self._refuse_switch()
            raise _HeadRefused  # stops the parser: this request never starts
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        """uvicorn's, without its two copies of every body chunk (appended to a bytearray, which
        ``receive`` copies into bytes): a chunk that arrives while none is waiting is kept as
        it is, and ``bytes()`` of bytes is the same object."""
        cycle = self.cycle
        if (self.parser.should_upgrade() and self._should_upgrade()) or cycle.response_complete:
            return
        cycle.body = cycle.body + body if cycle.body else body  # type: ignore[assignment]
        if len(cycle.body) > HIGH_WATER_LIMIT:
            self.flow.pause_reading()
        cycle.message_event.set()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._head_bytes = 0  # what follows is the next request's head

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.flow.write_paused:  # all but a little of it taken already
            self._disarm_answer()
        if self._deferred is not None:  # the response it waited for is out: its turn
            answer, self._deferred = self._deferred, None
            self._write_and_close(answer)

    def pause_writing(self) -> None:
        """The client is not keeping up with an answer: from now it has ``answer_timeout_s`` to
        take the rest (resuming does not reset that; finishing the answer does)."""
        super().pause_writing()
        if self._answer_deadline is None:
            self._answer_deadline = self.loop.call_later(
                self.limits.answer_timeout_s, self._not_taken
            )

    def resume_writing(self) -> None:
        super().resume_writing()
        if not self._responding():  # the answer is complete and all but a little of it taken
            self._disarm_answer()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to bytes that are not HTTP/1.1, as problem+json; none for a head
        refused already (the parser error is the one its refusal raised)."""
        self._answer_and_close(
            _closing_answer(
                400,
                "Bad Request",
                "invalid-request",
                "Invalid request",
                "the request line or headers are not valid HTTP/1.1",
            )
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._disarm_answer()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._head_deadline = self.loop.call_later(self.limits.header_timeout_s, self._too_slow)

    def _disarm(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _disarm_answer(self) -> None:
        if self._answer_deadline is not None:
            self._answer_deadline.cancel()
            self._answer_deadline = None

    def _not_taken(self) -> None:
        """The answer was not taken in time: the connection is reset, and what is left unsent
        dropped, the kernel's send queue too (closed gracefully, the socket would stay behind
        the client until it read its megabytes, or the kernel gave up on it)."""
        self._answer_deadline = None
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()

    def _responding(self) -> bool:
        """A response on this connection is still being made or sent."""
        return self.cycle is not None and not self.cycle.response_complete

    def _too_slow(self) -> None:
        self._head_deadline = None
        if self._responding():  # a pipelined head: the answer waits for the one on its way
            self._answer_and_close(_TIMEOUT)
        elif not self.transport.is_closing():
            self.transport.write(_TIMEOUT)
            self.transport.close()

    def _refuse_switch(self) -> None:
        """400 and close: the request asks to switch protocols, which no route does."""
        if self.parser.get_method() == b"CONNECT":
            detail = "CONNECT asks for a tunnel; this gateway is not a proxy"
        else:
            upgrade = next((value for name, value in self.headers if name == b"upgrade"), b"")
            shown = upgrade[:64].decode("latin-1") + ("..." if len(upgrade) > 64 else "")
            detail = (
                f"the request asks to switch protocols (Upgrade: {shown!r}); no route of this "
                "gateway does (no WebSocket or HTTP/2 endpoint): send it without Upgrade"
            )
        self._answer_and_close(
            _closing_answer(
                400, "Bad Request", "invalid-request", "Protocol switch refused", detail
            )
        )

    def _refuse(self, detail: str) -> None:
        """431 and close: the head is over a limit (the app never sees the request)."""
        self._answer_and_close(
            _closing_answer(
                431,
                "Request Header Fields Too Large",
                "request-header-fields-too-large",
                "Request head too large",
                f"{detail}; send a smaller request head",
            )
        )

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        # uvicorn picks its own 503 app past the connection limit: this connection's answers
        # instead, with the Retry-After of the app it serves
        if app is service_unavailable:
            app = self._connection_limit
        super()._start_asgi_task(cycle, app)

    async def _connection_limit(self, scope: Any, receive: Any, send: Any) -> None:
        """uvicorn's answer past its connection limit, as problem+json with a computed
        Retry-After."""
        wait = max(1, math.ceil(self.retry_after_s()))
        body = json.dumps(
            {
                "type": "https://clip-gateway.dev/problems/overloaded",
                "title": "Too many connections",
                "status": 503,
                "detail": f"this worker holds as many connections as it accepts; retry after "
                f"{wait} s",
            }
        ).encode()
        headers = [
            (b"content-type", b"application/problem+json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(wait).encode()),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    def _answer_and_close(self, answer: bytes) -> None:
        """Send ``answer``, then close once the client has read it: the rest of what it sends
        meanwhile is dropped unread for at most ``LINGER_S`` (closed with unread bytes, the
        socket would be reset and the answer lost with them). Once per connection."""
        if self._refused:
            return
        self._refused = True
        self._disarm()
        if self.transport.is_closing():
            return
        if self._responding():  # a pipelined request: the response on its way goes first
            self.flow.pause_reading()
            self._deferred = answer
            return
        self._write_and_close(answer)

    def _write_and_close(self, answer: bytes) -> None:
        if self.transport.is_closing():
            return
        self.transport.write(answer)
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()
