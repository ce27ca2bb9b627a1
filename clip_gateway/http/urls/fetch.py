"""URL items fetched so that the fetch cannot be turned against the network it runs from.

Each URL: parsed first into exactly what will be asked for (http/urls/targets.py: http or https
only, anything it cannot represent exactly refused); its host resolved once, and every address it
resolved to checked by the guard (http/urls/guard.py) before any connection; the connection made to
the vetted address itself (httpcore's pluggable network backend, so there is no second resolution a
DNS rebind could answer differently), the Host header and TLS SNI and certificate check still the
URL's name; each redirect (at most ``MAX_REDIRECTS``) parsed and checked the same way; connect and
total timeouts; the body streamed under a byte cap whatever Content-Length says, each chunk counted
against the in-flight body bytes before it is kept, and never decompressed (``Accept-Encoding:
identity``; a compressed answer is refused). httpcore, not httpx: it reads no proxy settings from
the environment and decodes nothing. Whatever goes wrong below (the resolver, the connection, the
HTTP exchange) is a ``UrlFailed`` about the item, translated here, once. The bytes are then an image
item like an upload's, sniffed by the decoder (Content-Type is not trusted).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import httpcore

from clip_gateway.errors import EmbeddingError, UrlFailed, UrlRefused
from clip_gateway.http.urls import guard
from clip_gateway.http.urls.slots import FetchSlots
from clip_gateway.http.urls.streams import StreamBackend
from clip_gateway.http.urls.targets import Target, follow

#: Redirects followed per URL item, each re-checked by the guard.
MAX_REDIRECTS = 3
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
#: Identity only: a compressed body is refused, never inflated (no decompression bomb).
_HEADERS: list[tuple[bytes, bytes]] = [
    (b"Accept-Encoding", b"identity"),
    (b"Accept", b"image/*"),
    (b"User-Agent", b"clip-gateway"),
]


#: The worker's fetcher's key on app.state (absent while URL items are off).
KEY = "url_fetcher"


def fetcher_of(state: Mapping[str, Any]) -> Fetcher | None:
    """The worker's fetcher (the app's lifespan put it on ``state``); None: URL items are off."""
    fetcher = state.get(KEY)
    assert fetcher is None or isinstance(fetcher, Fetcher)
    return fetcher


@dataclass(frozen=True)
class FetchOptions:
    allow: guard.Allowlist
    connect_timeout_s: float
    total_timeout_s: float
    max_bytes: int
    #: Fetches in flight at once in this worker...
    max_fetches: int
    #: ...by one request (0: ``max_fetches``)...
    per_request: int = 0
    #: ...and by one API key (0: ``max_fetches``).
    per_key: int = 0


class Budget(Protocol):
    """Where a fetch counts the body bytes it holds (the request's reservation: admission's
    bound on body bytes in flight); ``received`` may refuse."""

    def received(self, count: int) -> None: ...
    def released(self, count: int) -> None: ...


#: What httpcore (and below it the socket and TLS layers) raise for an exchange that failed.
_FAILURES = (
    httpcore.NetworkError,
    httpcore.ProtocolError,
    httpcore.ProxyError,
    httpcore.UnsupportedProtocol,
    OSError,  # ssl.SSLError is one
)


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
    """Fetches URL items for one worker under ``FetchOptions``, in the worker's fetch slots
    (``slots``); ``network`` is httpcore's backend the pinned connections go through
    (http/urls/streams.py: a connection reads no further ahead than it was asked; a test counts the
    connections it is asked for), ``ssl_context`` the trust a test's own CA replaces."""

    def __init__(
        self,
        options: FetchOptions,
        network: httpcore.AsyncNetworkBackend | None = None,
        resolve: Resolver = _resolve,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.options = options
        self.slots = FetchSlots(
            options.max_fetches,
            options.per_request or options.max_fetches,
            options.per_key or options.max_fetches,
            options.total_timeout_s,
        )
        self.network = network or StreamBackend()
        self._resolve = resolve
        #: The system's trust store, certificates checked against the URL's host name.
        self._ssl = ssl_context or ssl.create_default_context()

    @property
    def in_flight(self) -> int:
        """Fetch slots held in this worker."""
        return self.slots.held

    async def fetch(self, target: Target, budget: Budget) -> bytes:
        """The body at ``target``, redirects followed, under every rule; ``budget`` counts
        each chunk as it arrives (admission's body bytes in flight, which may refuse)."""
        timeout = self.options.total_timeout_s
        try:
            with self.slots.fetching():
                async with asyncio.timeout(timeout):
                    return await self._follow(target, budget)
        except TimeoutError:
            raise UrlFailed(f"the URL did not give its image within {timeout:g} s") from None

    async def _follow(self, target: Target, budget: Budget) -> bytes:
        for hop in range(MAX_REDIRECTS + 1):
            status, location, body = await self._get(target, budget)
            if status in _REDIRECTS:
                if location is None:
                    raise UrlFailed(f"the server answered {status} without a Location")
                target = follow(target, location)
                continue
            if status != 200:
                where = " after a redirect" if hop else ""
                raise UrlFailed(f"the server answered {status}{where}", upstream_status=status)
            return body
        raise UrlFailed(f"more than {MAX_REDIRECTS} redirects", rule="redirects")

    async def _get(self, target: Target, budget: Budget) -> tuple[int, bytes | None, bytes]:
        address = await self._vet(target)
        options = self.options
        timeouts = {"connect": options.connect_timeout_s, "read": options.total_timeout_s,
                    "write": options.total_timeout_s, "pool": options.total_timeout_s}  # fmt: skip
        # every part as http/urls/targets.py made it: httpcore parses nothing again
        url = httpcore.URL(scheme=target.scheme.encode(), host=target.host.encode(),
                           port=target.port, target=target.target.encode())  # fmt: skip
        headers = [(b"Host", target.authority.encode()), *_HEADERS]
        async with httpcore.AsyncConnectionPool(
            ssl_context=self._ssl,
            network_backend=_Pinned(address, self.network),
            max_connections=1,
            retries=0,
        ) as pool:
            try:
                async with pool.stream(
                    "GET", url, headers=headers, extensions={"timeout": timeouts}
                ) as response:
                    return await self._read(response, budget)
            except httpcore.ConnectTimeout:
                raise UrlFailed(
                    f"could not connect within {options.connect_timeout_s:g} s"
                ) from None
            except httpcore.TimeoutException:
                raise TimeoutError from None  # the total timeout's message
            except _FAILURES as exc:
                raise UrlFailed(f"the fetch failed: {type(exc).__name__}") from None

    async def _read(
        self, response: httpcore.Response, budget: Budget
    ) -> tuple[int, bytes | None, bytes]:
        headers = {k.lower(): v for k, v in response.headers}
        if response.status in _REDIRECTS:
            return response.status, headers.get(b"location"), b""
        if response.status != 200:
            return response.status, None, b""
        coding = headers.get(b"content-encoding", b"identity").strip().lower()
        if coding not in (b"", b"identity"):
            raise UrlFailed(
                f"the server sent a {coding.decode('latin-1')!r}-encoded body although "
                "identity was asked; compressed bodies are not decoded",
                rule="content-encoding",
            )
        return 200, None, await _body(response, self.options.max_bytes, budget)

    async def _vet(self, target: Target) -> str:
        """The one address to connect to for ``target``, every address its host resolved to
        having passed the guard."""
        allow = self.options.allow
        if target.address is not None:
            guard.check(target.host, target.address, allow, named=False)
            return str(guard.connected(target.address))
        host = target.host
        try:
            resolved = await self._resolve(host, target.port)
        except (OSError, UnicodeError, ValueError):
            raise UrlFailed(f"host {host!r} does not resolve", rule="dns") from None
        if not resolved:
            raise UrlFailed(f"host {host!r} does not resolve", rule="dns")
        addresses = []
        for found in resolved:
            try:
                addresses.append(ipaddress.ip_address(found.split("%")[0]))
            except ValueError:
                raise UrlRefused(f"host {host!r} resolved to something not an address",
                                 rule="dns") from None  # fmt: skip
            guard.check(host, addresses[-1], allow, named=True)
        return str(guard.connected(addresses[0]))


async def _body(response: httpcore.Response, limit: int, budget: Budget) -> bytes:
    """The body, at most ``limit`` bytes, every chunk counted on ``budget`` before it is kept.
    The chunks are kept as they came (no buffer grown ahead of them) and joined once at the
    end, the copy counted while both exist; a body that is not kept is given back at once."""
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in response.aiter_stream():
            if size + len(chunk) > limit:
                raise UrlFailed(f"the body is over {limit} bytes", rule="size", limit=limit)
            budget.received(len(chunk))
            size += len(chunk)
            chunks.append(chunk)
        if len(chunks) > 1:
            budget.received(size)  # the joined copy, while the chunks still exist
            chunks = [b"".join(chunks)]
            budget.released(size)
    except BaseException:
        chunks.clear()
        budget.released(size)
        raise
    return chunks[0] if chunks else b""


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
