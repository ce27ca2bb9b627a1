"""Immich's own machine-learning server behind this one (``GATEWAY_IMMICH_UPSTREAM``;
docs/IMMICH.md): a ``/predict`` the gateway does not serve is streamed there unchanged and its
answer handed back unchanged, so Immich is configured with one URL. Forwards never take a
decode thread or admission's budget (they do no work here); their own bound is a count of
requests in flight, and every one ends within ``immich_upstream_timeout_s``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass

import httpx

from clip_gateway.errors import EmbeddingError

#: The connection to an upstream must open within this (or the whole timeout, if shorter):
#: one that does not is down, and the next one is tried while the body is still unsent.
CONNECT_S = 5.0
#: The request headers that travel (never the gateway's own ``Authorization``: the gateway's
#: key is not the upstream's business; never hop-by-hop headers).
REQUEST_HEADERS = ("content-type", "content-length", "accept")
#: The answer's headers that come back with its status and body.
RESPONSE_HEADERS = ("content-type", "content-encoding", "retry-after")
#: An answer larger than this is not Immich's (a face list for a crowd is tens of KiB).
MAX_ANSWER_BYTES = 16 << 20
#: How often each upstream's ``/ping`` is asked while the app runs (as Immich's own
#: availability checks do), so the status route tells the truth between forwards.
PING_INTERVAL_S = 10.0


class UpstreamUnavailable(EmbeddingError):
    """No configured upstream accepted the connection (all down, refused or unresolvable)."""


class UpstreamBusy(UpstreamUnavailable):
    """This worker already has its limit of forwards in flight."""


class UpstreamTimeout(EmbeddingError):
    """The upstream did not answer within the forward's timeout."""


class UpstreamFailed(EmbeddingError):
    """The upstream broke the exchange (closed mid-answer, not HTTP, an oversized answer)."""


@dataclass
class UpstreamState:
    """What the gateway last learned about one upstream (the status route shows it)."""

    url: str
    state: str = "unknown"  # up | down | unknown
    #: Why it is down, in words that never carry a resolved address.
    detail: str = ""
    checked_at: float | None = None

    def mark(self, up: bool, detail: str = "") -> None:
        self.state, self.detail, self.checked_at = ("up" if up else "down"), detail, time.time()


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


def why(exc: httpx.HTTPError) -> str:
    """A failure in fixed words: an exception's own text can name resolved addresses."""
    if isinstance(exc, httpx.ConnectTimeout):
        return "the connection did not open in time"
    if isinstance(exc, httpx.ConnectError):
        return "the connection was refused or the name did not resolve"
    if isinstance(exc, httpx.TimeoutException):
        return "no answer in time"
    if isinstance(exc, httpx.RemoteProtocolError):
        return "the upstream closed the connection or did not speak HTTP"
    return "the exchange failed"


class Upstream:
    """The configured upstreams, tried in order (healthy ones first, as Immich's server tries
    its URLs); one pooled HTTP client; a bound on forwards in flight."""

    def __init__(self, urls: Iterable[str], timeout_s: float, concurrency: int) -> None:
        self.states = [UpstreamState(url) for url in urls]
        self.timeout_s = timeout_s
        self.concurrency = concurrency
        self.in_flight = 0
        connect = min(CONNECT_S, timeout_s)
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s, connect=connect),
            limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
            follow_redirects=False,
        )
        #: ``/ping`` has a client of its own: a pool full of stalled forwards must not queue
        #: the availability check behind them (it would time out in the pool and call a
        #: healthy-but-slow upstream down, and the status route would hang as long).
        self.pings = httpx.AsyncClient(
            timeout=CONNECT_S,
            limits=httpx.Limits(max_connections=len(self.states), max_keepalive_connections=0),
            follow_redirects=False,
        )

    @property
    def urls(self) -> str:
        return ", ".join(state.url for state in self.states)

    def ordered(self) -> list[UpstreamState]:
        return sorted(self.states, key=lambda state: state.state == "down")  # stable: in order

    async def forward(self, headers: dict[str, str], body: AsyncIterator[bytes]) -> Answer:
        """``body`` (the client's, as it arrives) to the first upstream that takes it; its answer
        read whole within the timeout. The next upstream is tried only while no byte of the body
        has been sent (a refused or timed-out connection); later failures are the answer."""
        if self.in_flight >= self.concurrency:
            raise UpstreamBusy(
                f"{self.in_flight} requests are being forwarded to Immich's ML server already "
                "(GATEWAY_IMMICH_UPSTREAM_CONCURRENCY)",
                retry_after=1.0,
            )
        self.in_flight += 1
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self._forward(headers, _Once(body))
        except TimeoutError as exc:
            raise UpstreamTimeout(
                f"Immich's ML server ({self.urls}) did not answer within "
                f"{self.timeout_s:g} s (GATEWAY_IMMICH_UPSTREAM_TIMEOUT_S)"
            ) from exc
        finally:
            self.in_flight -= 1

    async def _forward(self, headers: dict[str, str], body: _Once) -> Answer:
        refused: list[str] = []
        for state in self.ordered():
            request = self.client.build_request(
                "POST", f"{state.url}/predict", headers=headers, content=body
            )
            try:
                response = await self.client.send(request, stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                state.mark(False, why(exc))
                refused.append(f"{state.url}: {why(exc)}")
                if body.started:
                    break
                continue
            except httpx.HTTPError as exc:
                state.mark(False, why(exc))
                raise UpstreamFailed(f"Immich's ML server {state.url}: {why(exc)}") from exc
            try:
                answer = await _read(response)
            except httpx.HTTPError as exc:
                state.mark(False, why(exc))
                raise UpstreamFailed(f"Immich's ML server {state.url}: {why(exc)}") from exc
            finally:
                await response.aclose()
            state.mark(True)
            return answer
        raise UpstreamUnavailable(
            "Immich's ML server cannot be reached: " + "; ".join(refused), retry_after=CONNECT_S
        )

    async def ping_all(self) -> None:
        """Each upstream's ``/ping``, as Immich's availability check asks it: each state marked
        up or down (nothing raised)."""

        async def ping(state: UpstreamState) -> None:
            try:
                response = await self.pings.get(f"{state.url}/ping")
            except httpx.HTTPError as exc:
                state.mark(False, why(exc))
                return
            state.mark(response.is_success, "" if response.is_success else
                       f"/ping answered {response.status_code}")  # fmt: skip

        await asyncio.gather(*(ping(state) for state in self.states))

    async def watch(self) -> None:
        """``ping_all`` every ``PING_INTERVAL_S`` until cancelled (the app's lifespan runs it)."""
        while True:
            await self.ping_all()
            await asyncio.sleep(PING_INTERVAL_S)

    async def aclose(self) -> None:
        await self.client.aclose()
        await self.pings.aclose()


async def _read(response: httpx.Response) -> Answer:
    """The answer's bytes as they came (``aiter_raw``: never decompressed and re-encoded)."""
    body = bytearray()
    async for chunk in response.aiter_raw():
        body += chunk
        if len(body) > MAX_ANSWER_BYTES:
            raise UpstreamFailed(f"Immich's ML server's answer is over {MAX_ANSWER_BYTES} bytes")
    headers = {
        name: response.headers[name] for name in RESPONSE_HEADERS if name in response.headers
    }
    return Answer(response.status_code, headers, bytes(body))


class _Once:
    """The body as httpx reads it, remembering whether any of it has been sent."""

    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        self.chunks = chunks
        self.started = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.chunks:
            if chunk:
                self.started = True
                yield chunk
