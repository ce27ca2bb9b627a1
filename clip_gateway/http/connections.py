"""uvicorn's HTTP protocol with a deadline on the request head.

uvicorn closes idle keep-alive connections, but a connection that sends nothing, or a request
line and headers a byte at a time, holds its slot for ever (any byte cancels the keep-alive
timer), so a few hundred slow clients starve everyone else once ``limit_concurrency`` is
reached. Here every request head (request line and headers) must be complete within
``header_timeout_s`` of the connection opening or the request starting; otherwise the client gets
408 and the connection is closed. The body has its own deadline (``GATEWAY_BODY_TIMEOUT_S``).

Past ``GATEWAY_MAX_CONNECTIONS`` uvicorn answers 503 from an ASGI app of its own that says
nothing of when to retry; every 503 of this gateway carries a computed ``Retry-After``, so the
one below takes its place.
"""

from __future__ import annotations

import asyncio
import json
import math
from asyncio import TimerHandle
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

_BODY = (
    b'{"type":"https://clip-gateway.dev/problems/request-timeout","title":"Request head too '
    b'slow","status":408,"detail":"the request line and headers did not arrive in time"}'
)
_TIMEOUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/problem+json\r\n"
    b"connection: close\r\ncontent-length: " + str(len(_BODY)).encode() + b"\r\n\r\n" + _BODY
)


class DeadlineProtocol(HttpToolsProtocol):
    #: Seconds a request head may take; set from the settings by the app factory (per worker).
    header_timeout_s: float = 10.0
    #: Seconds a client refused at the connection limit should wait: the app sets it to this
    #: worker's admitted backlog (connections free as that work finishes).
    retry_after_s: Callable[[], float] = staticmethod(lambda: 1.0)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_deadline: TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._head_deadline is None:
            self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._head_deadline = self.loop.call_later(self.header_timeout_s, self._too_slow)

    def _disarm(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _too_slow(self) -> None:
        self._head_deadline = None
        if not self.transport.is_closing():
            self.transport.write(_TIMEOUT)
            self.transport.close()


async def connection_limit(scope: Any, receive: Any, send: Any) -> None:
    """uvicorn's answer past its connection limit, as problem+json with a computed Retry-After."""
    wait = max(1, math.ceil(DeadlineProtocol.retry_after_s()))
    body = json.dumps(
        {
            "type": "https://clip-gateway.dev/problems/overloaded",
            "title": "Too many connections",
            "status": 503,
            "detail": f"this worker holds as many connections as it accepts; retry after {wait} s",
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


# uvicorn looks this name up in its module each time a request passes the limit (no setting
# replaces it), so the module's binding is what changes which app answers.
httptools_impl.service_unavailable = connection_limit  # type: ignore[attr-defined]
