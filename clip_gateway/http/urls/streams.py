"""httpcore's network backend for URL fetches, on asyncio's streams, for what their reader does
with the socket: it stops reading (pauses the transport, in the very callback that received
the bytes) once it holds twice its ``limit``, so a connection never holds more than that and
one read ahead of the bytes a fetch has taken and counted (http/urls/fetch.py counts each chunk
against the in-flight body bytes). httpcore's default, AnyIO's stream, pauses only when its
reader next runs: under uvloop (uvicorn's loop) libuv reads a readable socket up to 32 times a
wakeup, so a connection held up to 8 MiB nobody had counted, and sixteen endless bodies held
2.7 times ``GATEWAY_MAX_BODY_MIB_IN_FLIGHT`` (tests/netns/test_url_budget.py).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterable
from typing import Any

import httpcore

#: What a connection's reader holds before it stops reading the socket (at twice this).
READ_LIMIT = 64 << 10


class StreamBackend(httpcore.AsyncNetworkBackend):
    """TCP connections as asyncio streams whose reader holds at most ``2 * limit`` bytes."""

    def __init__(self, limit: int = READ_LIMIT) -> None:
        self.limit = limit

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's signature)
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(host, port, limit=self.limit)
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"no connection within {timeout} s") from None
        except OSError as exc:
            raise httpcore.ConnectError(str(exc)) from exc
        sock = writer.get_extra_info("socket")
        for option in socket_options or ():
            sock.setsockopt(*option)
        return Stream(reader, writer)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's signature)
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("URL items never reach a Unix socket")

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class Stream(httpcore.AsyncNetworkStream):
    """One connection: httpcore's reads, writes and TLS upgrade, its errors httpcore's own."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        try:
            async with asyncio.timeout(timeout):
                return await self._reader.read(max_bytes)
        except TimeoutError:
            raise httpcore.ReadTimeout(f"nothing read within {timeout} s") from None
        except OSError as exc:
            raise httpcore.ReadError(str(exc)) from exc

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        if not buffer:
            return
        try:
            async with asyncio.timeout(timeout):
                self._writer.write(buffer)
                await self._writer.drain()
        except TimeoutError:
            raise httpcore.WriteTimeout(f"not written within {timeout} s") from None
        except OSError as exc:
            raise httpcore.WriteError(str(exc)) from exc

    async def aclose(self) -> None:
        # at once, without TLS's close_notify exchange: a fetch closes its connection when it
        # has its answer (or gave up on it), and a server that never answers the close would
        # keep the socket open half a minute behind it
        self._writer.transport.abort()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's signature)
    ) -> httpcore.AsyncNetworkStream:
        try:
            async with asyncio.timeout(timeout):
                await self._writer.start_tls(ssl_context, server_hostname=server_hostname)
        except TimeoutError:
            await self.aclose()
            raise httpcore.ConnectTimeout(f"no TLS handshake within {timeout} s") from None
        except (OSError, ValueError) as exc:  # ssl.SSLError, ssl.CertificateError
            await self.aclose()
            raise httpcore.ConnectError(str(exc)) from exc
        return self

    def get_extra_info(self, info: str) -> Any:
        names = {"client_addr": "sockname", "server_addr": "peername"}
        if info == "is_readable":  # an idle connection the server closed
            return self._reader.at_eof()
        return self._writer.get_extra_info(names.get(info, info))
