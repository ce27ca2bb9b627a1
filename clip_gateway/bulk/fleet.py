"""One or more gateways behind one ``post``: a bounded number of requests in flight on each,
``Retry-After`` honoured, 429 and 503 slowing the work instead of failing it, and a gateway
that goes away (connection refused or reset) taken out of rotation and tried again later, one
request at a time, until it answers.

A 429 says the gateway holds all the work it admits: the refused request waits its
Retry-After, and the gateway's share shrinks to what it still has in flight (growing back by
one per share of answers), so it stays busy without being sent what it would refuse; pausing
the whole gateway instead left it idle for each Retry-After (5.3 images/s against 27 on the CPU
profile here). A 503 (Triton unavailable, a draining gateway) pauses it for the Retry-After.

The work fails only when every gateway has been out of service (unreachable, or answering
503) for ``give_up_s`` without a break; a request the gateways answer 502/504 is tried
``retries`` times, then its failure is the caller's. Request bodies and answers are the
client SDK's (clip_gateway/client/core.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
import httpx

from clip_gateway.client.core import ClientError, T, problem

#: Answers that say "not now": the request waits (Retry-After, else a backoff) and is sent again.
SLOW_DOWN = frozenset({429, 503})
#: Answers that may pass: tried again, at most ``retries`` times.
TRANSIENT = frozenset({502, 504})


class GatewaysGone(RuntimeError):
    """Every gateway has been out of service for longer than the fleet waits."""


class Unreachable(Exception):
    """A request that got no answer: the connection refused, reset or timed out."""


class Http(Protocol):
    """One gateway's connections: ``request`` sends ``method path`` with httpx's keyword
    arguments (``content``, ``json``, ``params``, ``headers``) and returns the whole answer, or
    raises Unreachable."""

    async def request(self, method: str, path: str, **request: Any) -> httpx.Response: ...

    async def aclose(self) -> None: ...


class AiohttpGateway:
    """``Http`` on aiohttp: at most ``in_flight`` connections kept open to ``url``, the
    session made on the event loop of the first request."""

    def __init__(self, url: str, options: FleetOptions, headers: dict[str, str] | None) -> None:
        self.base = url.rstrip("/")
        self.options = options
        self.headers = headers or {}
        self.session: aiohttp.ClientSession | None = None

    async def request(self, method: str, path: str, **request: Any) -> httpx.Response:
        if self.session is None:
            self.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.options.in_flight),
                timeout=aiohttp.ClientTimeout(total=self.options.timeout_s),
                headers=self.headers,
                # the body handed on as it came: httpx.Response decodes any Content-Encoding
                auto_decompress=False,
            )
        try:
            async with self.session.request(
                method,
                self.base + path,
                data=request.get("content"),
                json=request.get("json"),
                params=request.get("params"),
                headers=request.get("headers"),
            ) as response:
                body = await response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise Unreachable(f"{type(exc).__name__}: {exc}".rstrip(": ")) from exc
        return httpx.Response(response.status, headers=response.raw_headers, content=body)

    async def aclose(self) -> None:
        if self.session is not None:
            await self.session.close()


@dataclass(frozen=True)
class FleetOptions:
    #: Requests in flight at once on each gateway (this process's share).
    in_flight: int = 4
    #: Tries of a request the gateway answers 502 or 504.
    retries: int = 4
    #: How long every gateway may be out of service before the work fails (seconds).
    give_up_s: float = 600.0
    #: First wait after a failure; doubles per failure in a row, up to ``max_backoff_s``.
    backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    timeout_s: float = 120.0


@dataclass(eq=False)
class Gateway:
    url: str
    http: Http
    #: Requests it may have in flight now: ``FleetOptions.in_flight``, less after a 429.
    limit: int
    busy: int = 0
    #: Answers in a row since the limit last changed.
    streak: int = 0
    #: Not used before this time (Retry-After, or the backoff of a gateway out of rotation).
    resume_at: float = 0.0
    #: Since when it has been out of service (unreachable or 503), None when it answers.
    out_since: float | None = None
    strikes: int = 0
    answered: int = 0
    events: list[str] = field(default_factory=list)

    def free(self, now: float) -> bool:
        # a gateway coming back is tried with one request, not a burst
        cap = 1 if self.out_since is not None else self.limit
        return self.resume_at <= now and self.busy < cap


class Fleet:
    def __init__(
        self,
        urls: Sequence[str],
        options: FleetOptions,
        *,
        headers: dict[str, str] | None = None,
        http: Callable[[str], Http] | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_event: Callable[[str], None] = lambda message: None,
    ) -> None:
        if not urls:
            raise ValueError("no gateway URL given")
        self.options = options
        self.clock = clock
        self.on_event = on_event
        connect = http or (lambda url: AiohttpGateway(url, options, headers))
        self.gateways = [Gateway(url.rstrip("/"), connect(url), options.in_flight) for url in urls]
        self._changed = asyncio.Condition()

    async def post(self, request: dict[str, Any], read: Callable[[httpx.Response], T]) -> T:
        """``POST /v1/embeddings`` with ``request`` (``Http.request``'s arguments) on some gateway;
        ``read``'s answer, or ClientError for an answer that trying again will not change."""
        failures = 0
        while True:
            gateway = await self._acquire()
            try:
                response = await gateway.http.request("POST", "/v1/embeddings", **request)
            except Unreachable as exc:
                self._out(gateway, str(exc), None)
                continue
            finally:
                await self._release(gateway)
            status = response.status_code
            if status == 200:
                self._back(gateway)
                return read(response)
            wait = retry_after(response)
            if status == 503:
                self._out(gateway, f"503 {problem(response).get('title', '')}".strip(), wait)
            elif status == 429:
                await self._refused(gateway, wait or self._backoff(1))
            elif status in TRANSIENT and failures < self.options.retries:
                failures += 1
                gateway.resume_at = max(gateway.resume_at, self.clock() + self._backoff(failures))
            else:
                raise ClientError(status, problem(response))

    async def get(self, path: str) -> httpx.Response | None:
        """``GET path`` on the first gateway that answers it (None: none does)."""
        for gateway in self.gateways:
            try:
                return await gateway.http.request(
                    "GET", path, headers={"Accept": "application/json"}
                )
            except Unreachable:
                continue
        return None

    async def _refused(self, gateway: Gateway, wait: float) -> None:
        """A 429: the gateway holds as much work as it admits. Its share shrinks to the
        requests it still has in flight (they were admitted and keep it busy; it grows again
        by one per share of answers), and the refused request waits its Retry-After. With
        nothing of ours in flight the refusal is about others' work: the gateway rests."""
        async with self._changed:
            gateway.limit = max(1, min(gateway.limit, gateway.busy))
            gateway.streak = 0
            if gateway.busy == 0:
                gateway.resume_at = max(gateway.resume_at, self.clock() + wait)
        await asyncio.sleep(wait)

    def _backoff(self, strikes: int) -> float:
        ceiling = min(self.options.max_backoff_s, self.options.backoff_s * 2 ** (strikes - 1))
        return random.uniform(ceiling / 2, ceiling)  # jitter, not cryptography

    def _out(self, gateway: Gateway, reason: str, wait: float | None) -> None:
        now = self.clock()
        gateway.strikes += 1
        pause = wait if wait is not None else self._backoff(gateway.strikes)
        gateway.resume_at = max(gateway.resume_at, now + pause)
        if gateway.out_since is None:
            gateway.out_since = now
            self._event(
                gateway,
                f"gateway {gateway.url} out of rotation ({reason}); tried again in {pause:.1f} s",
            )

    def _back(self, gateway: Gateway) -> None:
        gateway.answered += 1
        gateway.strikes = 0
        gateway.streak += 1
        if gateway.streak >= gateway.limit and gateway.limit < self.options.in_flight:
            gateway.limit += 1  # additive increase, after a 429's decrease
            gateway.streak = 0
        if gateway.out_since is not None:
            gone = self.clock() - gateway.out_since
            gateway.out_since = None
            self._event(gateway, f"gateway {gateway.url} back in rotation after {gone:.1f} s")

    def _event(self, gateway: Gateway, message: str) -> None:
        gateway.events.append(message)
        self.on_event(message)

    async def _acquire(self) -> Gateway:
        async with self._changed:
            while True:
                now = self.clock()
                free = [g for g in self.gateways if g.free(now)]
                if free:
                    chosen = min(free, key=lambda g: (g.busy / g.limit, g.answered))
                    chosen.busy += 1
                    return chosen
                outs = [g.out_since for g in self.gateways]
                if all(o is not None for o in outs):
                    since = min(o for o in outs if o is not None)
                    if now - since > self.options.give_up_s:
                        raise GatewaysGone(
                            f"no gateway answered for {now - since:.0f} s: "
                            + "; ".join(g.events[-1] for g in self.gateways if g.events)
                        )
                waits = [g.resume_at - now for g in self.gateways if g.resume_at > now]
                timeout = max(0.01, min(waits)) if waits else None
                with contextlib.suppress(TimeoutError):  # a pause is over: look again
                    await asyncio.wait_for(self._changed.wait(), timeout)

    async def _release(self, gateway: Gateway) -> None:
        async with self._changed:
            gateway.busy -= 1
            self._changed.notify_all()

    async def aclose(self) -> None:
        for gateway in self.gateways:
            await gateway.http.aclose()


def retry_after(response: httpx.Response) -> float | None:
    """The answer's Retry-After in seconds (the delta form; a date is not worth parsing here)."""
    value = response.headers.get("retry-after")
    try:
        seconds = float(value) if value is not None else math.nan
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None
