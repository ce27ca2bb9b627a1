"""uvicorn's HTTP protocol with a deadline on the request head.

uvicorn closes idle keep-alive connections, but a connection that sends nothing, or a request
line and headers a byte at a time, holds its slot for ever (any byte cancels the keep-alive
timer), so a few hundred slow clients starve everyone else once ``limit_concurrency`` is
reached. Here every request head (request line and headers) must be complete within
``header_timeout_s`` of the connection opening or the request starting; otherwise the client gets
408 and the connection is closed. The body has its own deadline (``GATEWAY_BODY_TIMEOUT_S``).
"""

from __future__ import annotations

import asyncio
from asyncio import TimerHandle
from typing import Any

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
