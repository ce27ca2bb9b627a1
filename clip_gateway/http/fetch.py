"""URL items fetched so that the fetch cannot be turned against the network it runs from.

Each URL: http or https only; its host resolved once, and every address it resolved to checked
by the guard (http/guard.py) before any connection; the connection made to the vetted address
itself (httpcore's pluggable network backend, so there is no second resolution a DNS rebind
could answer differently), the Host header and TLS SNI and certificate check still the URL's
name; each redirect (at most ``MAX_REDIRECTS``) checked the same way; connect and total
timeouts; the body streamed under a byte cap whatever Content-Length says, and never
decompressed (``Accept-Encoding: identity``; a compressed answer is refused). httpcore, not
httpx: it reads no proxy settings from the environment and decodes nothing. The bytes are then
an image item like an upload's, sniffed by the decoder (Content-Type is not trusted), and count
against the request's admission as its body bytes do.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpcore

from clip_gateway.errors import EmbeddingError, Overloaded, UrlFailed, UrlRefused
from clip_gateway.http import guard

#: Redirects followed per URL item, each re-checked by the guard.
MAX_REDIRECTS = 3
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
#: Identity only: a compressed body is refused, never inflated (no decompression bomb).
_HEADERS: dict[bytes | str, bytes | str] = {
    "Accept-Encoding": "identity",
    "Accept": "image/*",
    "User-Agent": "clip-gateway",
}


@dataclass(frozen=True)
class FetchOptions:
    allow: guard.Allowlist
    connect_timeout_s: float
    total_timeout_s: float
    max_bytes: int
    #: Fetches in flight at once in this worker.
    max_fetches: int


class _Pinned(httpcore.AsyncNetworkBackend):
    """Connects to the address the guard vetted, whatever host httpcore asks for (it asks for
    the URL's, which still goes into SNI, the certificate check and the Host header)."""

    def __init__(self, address: str, inner: httpcore.AsyncNetworkBackend) -> None:
        self._address, self._inner = address, inner

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's signature)
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        return await self._inner.connect_tcp(
            self._address, port, timeout=timeout, socket_options=socket_options
        )

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 (httpcore's signature)
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise UrlRefused("URL items never reach a Unix socket (rule: scheme)")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


#: Resolves a host and port to addresses (the event loop's getaddrinfo; a test may pin one).
Resolver = Callable[[str, int], Awaitable[list[str]]]


async def _resolve(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


class Fetcher:
    """Fetches URL items for one worker under ``FetchOptions``; ``network`` is httpcore's
    backend the pinned connections go through (a test counts the connections it is asked for),
    ``ssl_context`` the trust a test's own CA replaces."""

    def __init__(
        self,
        options: FetchOptions,
        network: httpcore.AsyncNetworkBackend | None = None,
        resolve: Resolver = _resolve,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.options = options
        self.network = network or httpcore.AnyIOBackend()
        self._resolve = resolve
        #: The system's trust store, certificates checked against the URL's host name.
        self._ssl = ssl_context or ssl.create_default_context()
        self.in_flight = 0

    def slots(self, wanted: int) -> int:
        """How many fetches a request may run at once now (at least one, else Overloaded:
        refused at once, as admission refuses, rather than queued)."""
        free = self.options.max_fetches - self.in_flight
        if free <= 0:
            raise Overloaded(
                f"{self.in_flight} URL fetches in flight, the most this worker runs at once",
                retry_after=1.0,
            )
        return min(free, wanted)

    async def fetch(self, url: str, on_bytes: Callable[[int], None]) -> bytes:
        """The body at ``url``, redirects followed, under every rule; ``on_bytes`` hears of
        each chunk (admission counts them as body bytes in flight, and may refuse)."""
        self.in_flight += 1
        try:
            async with asyncio.timeout(self.options.total_timeout_s):
                return await self._follow(url, on_bytes)
        except TimeoutError:
            raise UrlFailed(
                f"the URL did not give its image within {self.options.total_timeout_s:g} s"
            ) from None
        finally:
            self.in_flight -= 1

    async def _follow(self, url: str, on_bytes: Callable[[int], None]) -> bytes:
        for hop in range(MAX_REDIRECTS + 1):
            status, location, body = await self._get(url, on_bytes)
            if status in _REDIRECTS:
                if location is None:
                    raise UrlFailed(f"the server answered {status} without a Location")
                url = urljoin(url, location)
                continue
            if status != 200:
                where = " after a redirect" if hop else ""
                raise UrlFailed(f"the server answered {status}{where}", upstream_status=status)
            return body
        raise UrlFailed(f"more than {MAX_REDIRECTS} redirects", rule="redirects")

    async def _get(
        self, url: str, on_bytes: Callable[[int], None]
    ) -> tuple[int, str | None, bytes]:
        address = await self._vet(url)
        options = self.options
        timeouts = {"connect": options.connect_timeout_s, "read": options.total_timeout_s,
                    "write": options.total_timeout_s, "pool": options.total_timeout_s}  # fmt: skip
        async with httpcore.AsyncConnectionPool(
            ssl_context=self._ssl,
            network_backend=_Pinned(address, self.network),
            max_connections=1,
            retries=0,
        ) as pool:
            try:
                async with pool.stream(
                    "GET",
                    url,
                    headers=_HEADERS,
                    extensions={"timeout": timeouts},
                ) as response:
                    return await self._read(response, on_bytes)
            except httpcore.ConnectTimeout:
                raise UrlFailed(
                    f"could not connect within {options.connect_timeout_s:g} s"
                ) from None
            except httpcore.TimeoutException:
                raise TimeoutError from None  # the total timeout's message
            except (httpcore.NetworkError, httpcore.ProtocolError) as exc:
                raise UrlFailed(f"the fetch failed: {type(exc).__name__}") from None

    async def _read(
        self, response: httpcore.Response, on_bytes: Callable[[int], None]
    ) -> tuple[int, str | None, bytes]:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in response.headers}
        if response.status in _REDIRECTS:
            return response.status, headers.get("location"), b""
        if response.status != 200:
            return response.status, None, b""
        coding = headers.get("content-encoding", "identity").strip().lower()
        if coding not in ("", "identity"):
            raise UrlFailed(
                f"the server sent a {coding!r}-encoded body although identity was asked; "
                "compressed bodies are not decoded",
                rule="content-encoding",
            )
        limit, body = self.options.max_bytes, bytearray()
        async for chunk in response.aiter_stream():
            if len(body) + len(chunk) > limit:
                raise UrlFailed(f"the body is over {limit} bytes", rule="size", limit=limit)
            on_bytes(len(chunk))
            body += chunk
        return 200, None, bytes(body)

    async def _vet(self, url: str) -> str:
        """The one address to connect to for ``url``, every address its host resolved to
        having passed the guard."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise UrlRefused(
                f"URL scheme {parts.scheme!r} is not fetched; only http and https (rule: scheme)",
                rule="scheme",
            )
        if parts.username is not None or parts.password is not None:
            raise UrlRefused("URLs with credentials are not fetched (rule: userinfo)",
                             rule="userinfo")  # fmt: skip
        host = parts.hostname or ""
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise UrlRefused("the URL's port is not a number in range (rule: port)",
                             rule="port") from None  # fmt: skip
        if not host:
            raise UrlRefused("the URL has no host (rule: host)", rule="host")
        allow = self.options.allow
        address = guard.literal(host)
        if address is not None:
            guard.check(host, address, allow, named=False)
            return str(address)
        try:
            resolved = await self._resolve(host, port)
        except OSError:
            raise UrlFailed(f"host {host!r} does not resolve", rule="dns") from None
        if not resolved:
            raise UrlFailed(f"host {host!r} does not resolve", rule="dns")
        for found in resolved:
            parsed = guard.literal(found.split("%")[0])
            if parsed is None:
                raise UrlRefused(f"host {host!r} resolved to something not an address",
                                 rule="dns")  # fmt: skip
            guard.check(host, parsed, allow, named=True)
        return str(resolved[0])


def failed(exc: EmbeddingError, index: int, url: str) -> EmbeddingError:
    """``exc`` about item ``index``: its reason prefixed with the item, the URL named."""
    exc.index = index
    exc.reason = f"input[{index}] ({_shown(url)}): {exc.reason}"
    exc.args = (exc.reason,)
    exc.extra.setdefault("url", _shown(url))
    return exc


def _shown(url: str) -> str:
    """The URL as the client sent it, cut to a length a problem document can carry."""
    return url if len(url) <= 200 else url[:200] + "..."
