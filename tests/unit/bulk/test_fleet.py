"""The bulk job's gateway fleet (clip_gateway/bulk/fleet.py) on httpx's MockTransport: requests
in flight bounded per gateway, Retry-After honoured, 429 and 503 slowing instead of failing, a
gateway that goes away out of rotation and back, and when the fleet gives up."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from clip_gateway.bulk.fleet import Fleet, FleetOptions, GatewaysGone, Unreachable
from clip_gateway.client.core import ClientError

A, B = "http://a.test", "http://b.test"


def read(response: httpx.Response) -> str:
    return str(response.request.url.host)


async def posts(fleet: Fleet, count: int, **request: object) -> list[str]:
    return await asyncio.gather(
        *(fleet.post({"content": b"x", **request}, read) for _ in range(count))
    )


def run(fleet: Fleet, count: int) -> list[str]:
    async def main() -> list[str]:
        try:
            return await posts(fleet, count)
        finally:
            await fleet.aclose()

    return asyncio.run(main())


class Mocked:
    """The fleet's ``Http`` on httpx's MockTransport: ``handler`` answers every request."""

    def __init__(self, url: str, handler) -> None:  # type: ignore[no-untyped-def]
        self.client = httpx.AsyncClient(base_url=url, transport=httpx.MockTransport(handler))

    async def request(self, method: str, path: str, **request: object) -> httpx.Response:
        try:
            return await self.client.request(method, path, **request)  # type: ignore[arg-type]
        except httpx.TransportError as exc:
            raise Unreachable(f"{type(exc).__name__}: {exc}") from exc

    async def aclose(self) -> None:
        await self.client.aclose()


def fleet_of(handler, urls=(A,), **options: float) -> Fleet:  # type: ignore[no-untyped-def]
    return Fleet(urls, FleetOptions(**options), http=lambda url: Mocked(url, handler))  # type: ignore[arg-type]


def test_requests_in_flight_are_bounded_per_gateway() -> None:
    busy = {"a.test": 0, "b.test": 0}
    most = dict(busy)

    async def handler(request: httpx.Request) -> httpx.Response:
        host = request.url.host
        busy[host] += 1
        most[host] = max(most[host], busy[host])
        await asyncio.sleep(0.01)
        busy[host] -= 1
        return httpx.Response(200)

    hosts = run(fleet_of(handler, (A, B), in_flight=3), 60)
    assert most == {"a.test": 3, "b.test": 3}
    assert hosts.count("a.test") > 0 and hosts.count("b.test") > 0


def test_429_and_503_slow_the_work_for_their_retry_after_and_never_fail_it() -> None:
    answers = iter(
        [
            httpx.Response(429, headers={"Retry-After": "0.3"}),
            httpx.Response(
                503, headers={"Retry-After": "0.3"}, json={"title": "Inference backend unavailable"}
            ),
        ]
    )
    sent: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(time.monotonic())
        return next(answers, httpx.Response(200))

    fleet = fleet_of(handler, in_flight=1)
    assert run(fleet, 1) == ["a.test"]
    assert len(sent) == 3
    assert sent[1] - sent[0] >= 0.3 and sent[2] - sent[1] >= 0.3  # each Retry-After waited out
    assert fleet.gateways[0].events[0].startswith(f"gateway {A} out of rotation (503 Inference")
    assert fleet.gateways[0].events[1].startswith(f"gateway {A} back in rotation")


@pytest.mark.slow
def test_a_429_shrinks_the_share_and_the_admitted_requests_keep_the_gateway_busy() -> None:
    """The refused request waits its Retry-After (1 s) while the gateway, which admitted the
    others, is sent the rest one at a time: it is never left idle for the Retry-After."""
    sent: list[str] = []
    admitted = asyncio.Event()

    async def handler(request: httpx.Request) -> httpx.Response:
        name = request.content.decode()
        sent.append(name)
        if name == "first" and sent.count("first") == 1:
            await admitted.wait()  # refused while another request of ours is in flight
            return httpx.Response(429, headers={"Retry-After": "1"})
        admitted.set()
        await asyncio.sleep(0.01)
        return httpx.Response(200)

    fleet = fleet_of(handler, in_flight=2)

    async def main() -> None:
        try:
            first = asyncio.create_task(fleet.post({"content": b"first"}, read))
            await asyncio.sleep(0)  # "first" goes out before the others
            await asyncio.gather(first, *(fleet.post({"content": f"{i}".encode()}, read)
                                          for i in range(8)))  # fmt: skip
        finally:
            await fleet.aclose()

    asyncio.run(main())
    assert sent[0] == "first" and sent[-1] == "first"  # tried again after the Retry-After only
    assert sorted(sent[1:-1]) == [str(i) for i in range(8)]  # every other one answered meanwhile
    assert fleet.gateways[0].limit == 2  # grown back to the whole share


def test_a_gateway_that_goes_away_leaves_the_rotation_and_comes_back() -> None:
    state = {"a_up": False, "a_calls": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "a.test":
            state["a_calls"] += 1
            if not state["a_up"]:
                raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(200)

    fleet = fleet_of(handler, (A, B), in_flight=2, backoff_s=0.05, max_backoff_s=0.1)
    a = fleet.gateways[0]

    async def main() -> None:
        try:
            assert set(await posts(fleet, 20)) == {"b.test"}  # every request answered, by B
            assert len(a.events) == 1
            assert a.events[0].startswith(
                f"gateway {A} out of rotation (ConnectError: connection refused); tried again in"
            )
            tried = state["a_calls"]
            state["a_up"] = True
            while "a.test" not in await posts(fleet, 2):  # A is tried again, one at a time
                pass
            assert state["a_calls"] > tried
        finally:
            await fleet.aclose()

    asyncio.run(main())
    assert a.events[-1].startswith(f"gateway {A} back in rotation")


def test_every_gateway_gone_for_longer_than_give_up_fails_the_work_naming_them() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    fleet = fleet_of(handler, (A, B), give_up_s=0.3, backoff_s=0.05, max_backoff_s=0.1)
    with pytest.raises(GatewaysGone, match=r"no gateway answered for .*a\.test.*b\.test"):
        run(fleet, 1)


def test_502_is_tried_again_then_is_the_callers_and_400_at_once() -> None:
    calls = {"n": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if request.headers.get("x-case") == "bad":
            return httpx.Response(400, json={"title": "Invalid request", "detail": "no items"})
        return httpx.Response(502, json={"title": "Inference backend failed"})

    fleet = fleet_of(handler, retries=2, backoff_s=0.01)

    async def main() -> None:
        try:
            with pytest.raises(ClientError, match="502: Inference backend failed"):
                await posts(fleet, 1, headers={"x-case": "transient"})
            assert calls["n"] == 3
            with pytest.raises(ClientError, match="400: no items"):
                await posts(fleet, 1, headers={"x-case": "bad"})
            assert calls["n"] == 4
        finally:
            await fleet.aclose()

    asyncio.run(main())
