"""Immich's own machine-learning server behind this one (``GATEWAY_IMMICH_UPSTREAM``;
docs/IMMICH.md): a ``/predict`` the gateway does not serve is streamed there unchanged and its
answer handed back unchanged, so Immich is configured with one URL. Forwards never take a
decode thread or admission's budget (they do no work here); their own bound is a count of
slots, each held from the forward's start until its client has taken the answer, and every
exchange with the upstream ends within ``immich_upstream_timeout_s``.

Every forward has a connection of its own, closed after its answer: a connection is never
reused, so bytes an upstream writes past the end of one answer (a second response, data after
a chunked body's end, the body of a 204) can never be read as the answer to another forward.
What cannot be relayed as it came (a status outside 200-599, a header byte the gateway's
HTTP server would refuse to write) is a 502 naming it, never a 500 or a closed connection.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx
from litestar import Request, Response
from litestar.response.base import ASGIResponse
from litestar.types import Receive, Scope, Send

from clip_gateway.errors import (
    BodyTooSlow,
    MalformedRequest,
    UpstreamBusy,
    UpstreamFailed,
    UpstreamTimeout,
    UpstreamUnavailable,
)

if TYPE_CHECKING:
    from litestar import Litestar

#: The connection to an upstream must open within this (or the whole timeout, if shorter):
#: one that does not is down, and the next one is tried while the body is still unsent.
CONNECT_S = 5.0
#: A request header value the upstream can be sent as it came: visible ASCII words separated
#: by spaces or tabs (what HTTP/1.1 field values are, without the obsolete non-ASCII bytes).
SENDABLE = re.compile(rb"[\x21-\x7e]+(?:[ \t]+[\x21-\x7e]+)*")
#: The answer's headers that come back with its status and body, every occurrence, in order.
RESPONSE_HEADERS = (b"content-type", b"content-encoding", b"retry-after")
#: Bytes the gateway's HTTP server refuses to write in a header value (uvicorn's own rule:
#: controls but HTAB, and DEL). HTTP parsers on the upstream side let some of them through.
UNWRITABLE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
#: Statuses an answer may carry back: final ones the gateway's server can write. 1xx are not
#: answers (101 would tell the client the connection switched protocols).
RELAYED_STATUSES = range(200, 600)
#: An answer larger than this is not Immich's (a face list for a crowd is tens of KiB).
MAX_ANSWER_BYTES = 16 << 20
#: The answer goes back in pieces of this size: the server sends the next only once its
#: buffer has room (uvicorn's high-water mark is 64 KiB), so what a client has not taken stays
#: in the answer its slot holds, not in the connection's buffer.
PIECE = 64 << 10
#: How often each upstream's ``/ping`` is asked while the app runs (as Immich's own
#: availability checks do), so the status route tells the truth between forwards.
PING_INTERVAL_S = 10.0


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
    #: The relayed headers as they came (names lower case), each value checked writable.
    headers: list[tuple[bytes, bytes]]
    body: bytes


@dataclass
class Slot:
    """One of the forwards in flight a worker allows: taken before the forward starts, given
    back once its client has taken the answer (or left), so an answer's memory is counted
    against the slot until then. Giving it back twice gives it back once."""

    upstream: Upstream
    released: bool = field(default=False)

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.upstream.in_flight -= 1


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
    if isinstance(exc, httpx.WriteError):
        return "the connection broke while the request was being sent"
    if isinstance(exc, httpx.ReadError):
        return "the connection broke while the answer was being read"
    return "the exchange failed"


class Upstream:
    """The configured upstreams, tried in order (healthy ones first, as Immich's server tries
    its URLs); one HTTP client, a connection per forward; a bound on forwards in flight."""

    def __init__(self, urls: Iterable[str], timeout_s: float, concurrency: int) -> None:
        self.states = [UpstreamState(url) for url in urls]
        self.timeout_s = timeout_s
        self.concurrency = concurrency
        self.in_flight = 0
        connect = min(CONNECT_S, timeout_s)
        # No connection is kept for another forward (max_keepalive_connections=0, and the
        # request says Connection: close): what an upstream wrote past one answer dies with
        # its connection. A loopback or private-network connect costs well under a
        # millisecond against the tens of milliseconds of a face or OCR request.
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s, connect=connect),
            limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=0),
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
        #: The ping in progress: concurrent status calls wait for this one rather than each
        #: queueing a ping of its own behind the pings client's connections.
        self._pinging: asyncio.Task[None] | None = None

    @property
    def urls(self) -> str:
        return ", ".join(state.url for state in self.states)

    def ordered(self) -> list[UpstreamState]:
        return sorted(self.states, key=lambda state: state.state == "down")  # stable: in order

    def slot(self) -> Slot:
        """A forward slot, or ``UpstreamBusy`` at once when this worker has none free."""
        if self.in_flight >= self.concurrency:
            raise UpstreamBusy(
                f"{self.in_flight} requests are being forwarded to Immich's ML server already "
                "(GATEWAY_IMMICH_UPSTREAM_CONCURRENCY)",
                retry_after=1.0,
            )
        self.in_flight += 1
        return Slot(self)

    async def forward(
        self, headers: list[tuple[bytes, bytes]], body: AsyncIterator[bytes]
    ) -> Answer:
        """``body`` (the client's, as it arrives, under the client's own clocks) to the first
        upstream that takes it; its answer read whole within the timeout. The next upstream is
        tried only while no byte of the body has been sent (a refused or timed-out connection);
        later failures are the answer. The caller holds a ``slot()``."""
        once = _Once(body)
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self._forward([*headers, (b"connection", b"close")], once)
        except TimeoutError as exc:
            if once.waiting:  # the time ran out waiting for the client's bytes: its slowness
                raise BodyTooSlow(
                    f"request body not received within the {self.timeout_s:g} s a forward may "
                    "take (GATEWAY_IMMICH_UPSTREAM_TIMEOUT_S)"
                ) from exc
            raise UpstreamTimeout(
                f"Immich's ML server ({self.urls}) did not answer within "
                f"{self.timeout_s:g} s (GATEWAY_IMMICH_UPSTREAM_TIMEOUT_S)"
            ) from exc

    async def _forward(self, headers: list[tuple[bytes, bytes]], body: _Once) -> Answer:
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
                answer = await _read(response, state.url)
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
        up or down (nothing raised). Callers that come while a ping is in progress share it
        (a caller that leaves does not cancel it for the others)."""
        if self._pinging is None or self._pinging.done():
            self._pinging = asyncio.ensure_future(self._ping_all())
        await asyncio.shield(self._pinging)

    async def _ping_all(self) -> None:
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
        if self._pinging is not None:
            self._pinging.cancel()
        await self.client.aclose()
        await self.pings.aclose()


def request_headers(
    headers: Iterable[tuple[bytes, bytes]], declared: int | None
) -> list[tuple[bytes, bytes]]:
    """The headers a forward carries, from the client's (ASGI: raw bytes, names lower case):
    its ``Content-Type`` as sent (the upstream reads the form by it; 400 naming it when it
    cannot be sent as it came, or is given twice), its ``Accept`` when it can be (optional:
    dropped otherwise), the body's declared length, and ``Accept-Encoding: identity`` (the
    answer's bytes as the upstream made them). Never ``Authorization``, never hop-by-hop
    headers (``Upgrade`` never reaches a route: http/connections.py refuses it)."""
    given = [(name, value.strip(b" \t")) for name, value in headers]
    types = [value for name, value in given if name == b"content-type" and value]
    if len(types) > 1:
        raise MalformedRequest(
            f"the Content-Type header is given {len(types)} times; send one (the request is "
            "forwarded to Immich's ML server)"
        )
    for value in types:
        if not SENDABLE.fullmatch(value):
            byte = next((b for b in value if not (0x20 <= b < 0x7F or b == 0x09)), 0x20)
            raise MalformedRequest(
                f"the Content-Type header holds the byte 0x{byte:02x}; a request forwarded to "
                "Immich's ML server carries header values in visible ASCII"
            )
    accepts = [value for name, value in given if name == b"accept" and SENDABLE.fullmatch(value)]
    out = [(b"content-type", value) for value in types]
    if accepts:
        out.append((b"accept", b", ".join(accepts)))
    if declared is not None:
        out.append((b"content-length", str(declared).encode()))
    return [*out, (b"accept-encoding", b"identity")]


class Relayed(Response[bytes]):
    """The upstream's answer, as the route returns it (Litestar turns a ``Response`` into what
    it sends with ``to_asgi_response``: here, ``Relaying``)."""

    def __init__(self, answer: Answer, slot: Slot) -> None:
        super().__init__(answer.body, status_code=answer.status)
        self.answer, self.slot = answer, slot

    def to_asgi_response(
        self, app: Litestar | None, request: Request[Any, Any, Any], **_: Any
    ) -> ASGIResponse:
        return Relaying(self.answer, self.slot)


class Relaying(ASGIResponse):
    """The upstream's answer on its way to the client: its status, relayed headers (the bytes
    as they came) and body, sent in ``PIECE``-sized parts, each once the client has taken
    enough of the one before; the forward's slot is given back once the last part is out (or
    the client has gone). A client that stops reading is dropped by its connection's answer
    deadline (http/connections.py), so the slot cannot be held by one."""

    def __init__(self, answer: Answer, slot: Slot) -> None:
        super().__init__(
            body=answer.body,
            status_code=answer.status,
            headers=[(n.decode("latin-1"), v.decode("latin-1")) for n, v in answer.headers],
            media_type="application/octet-stream",  # when the upstream named none
        )
        self.slot = slot

    async def send_body(self, send: Send, receive: Receive) -> None:
        body = memoryview(self.body)
        for at in range(0, len(body), PIECE):
            await send({"type": "http.response.body", "body": bytes(body[at : at + PIECE]),
                        "more_body": at + PIECE < len(body)})  # fmt: skip
        if not body:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.slot.release()


def check_relayable(status: int, headers: list[tuple[bytes, bytes]], url: str) -> None:
    """``UpstreamFailed`` saying why, for an answer that cannot go back as it came (checked
    before its body is read)."""
    if status not in RELAYED_STATUSES:
        raise UpstreamFailed(
            f"Immich's ML server {url} answered with status {status}, which is not a final "
            "HTTP status (200-599) the gateway can relay"
        )
    for name, value in headers:
        if (bad := UNWRITABLE.search(value)) is not None:
            raise UpstreamFailed(
                f"Immich's ML server {url} answered with a {name.decode()} header holding the "
                f"control byte 0x{bad[0][0]:02x}, which the gateway cannot relay"
            )


async def _read(response: httpx.Response, url: str) -> Answer:
    """The answer's bytes as they came (``aiter_raw``: never decompressed and re-encoded), its
    status and relayed headers as they came (raw bytes, never decoded and re-encoded)."""
    headers = [(n.lower(), v) for n, v in response.headers.raw if n.lower() in RESPONSE_HEADERS]
    check_relayable(response.status_code, headers, url)
    body = bytearray()
    async for chunk in response.aiter_raw():
        body += chunk
        if len(body) > MAX_ANSWER_BYTES:
            raise UpstreamFailed(f"Immich's ML server's answer is over {MAX_ANSWER_BYTES} bytes")
    return Answer(response.status_code, headers, bytes(body))


class _Once:
    """The body as httpx reads it, remembering whether any of it has been sent and whether
    the forward is waiting for the client's next bytes."""

    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        self.chunks = chunks
        self.started = False
        self.waiting = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            self.waiting = True  # left set when the wait ends in a timeout
            try:
                chunk = await anext(self.chunks)
            except StopAsyncIteration:
                self.waiting = False
                return
            self.waiting = False
            if chunk:
                self.started = True
                yield chunk
