"""http/body.py: a body read from the ASGI channel under its size limit, its pace and the
admission's count of the bytes as they arrive."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from clip_gateway.errors import BodyTooSlow, ClientGone, LimitExceeded, Overloaded
from clip_gateway.http import body


async def chunked(data: bytes, size: int) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]
    yield b""


def channel(*messages: dict) -> body.Receive:
    """An ASGI receive callable that hands out ``messages`` in order."""
    queue = list(messages)

    async def receive() -> dict:
        return queue.pop(0)

    return receive


async def collect(chunks: AsyncIterator[bytes]) -> list[bytes]:
    return [chunk async for chunk in chunks]


def test_read_chunks_end_with_an_empty_chunk_and_skip_empty_messages() -> None:
    receive = channel(
        {"type": "http.request", "body": b"ab", "more_body": True},
        {"type": "http.request", "more_body": True},  # no body key at all
        {"type": "http.request", "body": b"", "more_body": True},
        {"type": "http.request", "body": b"cd"},  # more_body absent: the last
    )
    assert asyncio.run(collect(body.read_chunks(receive, 4))) == [b"ab", b"cd", b""]


def test_read_chunks_allow_exactly_the_limit_and_refuse_one_byte_more() -> None:
    exact = channel({"type": "http.request", "body": b"abc", "more_body": True},
                    {"type": "http.request", "body": b"d", "more_body": False})  # fmt: skip
    assert asyncio.run(collect(body.read_chunks(exact, 4))) == [b"abc", b"d", b""]
    over = channel({"type": "http.request", "body": b"abc", "more_body": True},
                   {"type": "http.request", "body": b"de", "more_body": False})  # fmt: skip
    with pytest.raises(LimitExceeded) as raised:
        asyncio.run(collect(body.read_chunks(over, 4)))
    assert raised.value.reason == "request body over 4 bytes"
    assert raised.value.extra == {"limit": 4}


def test_a_client_that_disconnects_mid_body_is_gone() -> None:
    receive = channel({"type": "http.request", "body": b"ab", "more_body": True},
                      {"type": "http.disconnect"})  # fmt: skip
    with pytest.raises(ClientGone) as gone:
        asyncio.run(collect(body.read_chunks(receive, 100)))
    assert gone.value.reason == "client disconnected while sending the request body"


def test_read_all_joins_the_chunks_in_one_buffer() -> None:
    whole = asyncio.run(body.read_all(chunked(b"abcdef", 4)))
    assert whole == bytearray(b"abcdef") and isinstance(whole, bytearray)


def test_each_chunk_is_counted_as_it_arrives_and_may_be_refused() -> None:
    seen: list[int] = []
    receive = channel({"type": "http.request", "body": b"abc", "more_body": True},
                      {"type": "http.request", "body": b"de", "more_body": False})  # fmt: skip
    asyncio.run(collect(body.read_chunks(receive, 100, on_bytes=seen.append)))
    assert seen == [3, 2]

    def refuse(count: int) -> None:
        raise Overloaded("full", retry_after=7)

    receive = channel({"type": "http.request", "body": b"abc", "more_body": True})
    with pytest.raises(Overloaded):
        asyncio.run(collect(body.read_chunks(receive, 100, on_bytes=refuse)))


def stalled_after(*messages: dict[str, object]) -> Callable[[], Awaitable[dict[str, object]]]:
    """An ASGI channel that delivers ``messages``, then never another."""
    queue = list(messages)

    async def receive() -> dict[str, object]:
        if queue:
            return queue.pop(0)
        await asyncio.Event().wait()  # a client that sends nothing more
        raise AssertionError("unreachable")

    return receive


def test_a_body_under_the_minimum_rate_after_the_grace_is_too_slow() -> None:
    pace = body.Pace(min_bytes_per_s=1000, grace_s=0.05)
    receive = stalled_after({"type": "http.request", "body": b"x" * 20, "more_body": True})
    with pytest.raises(BodyTooSlow) as slow:
        asyncio.run(collect(body.read_chunks(receive, 100, pace=pace)))
    # 20 bytes bought 20 ms more than the grace: cut then, not at the body timeout (which
    # this channel does not have: without the pace the test would hang)
    assert slow.value.reason.startswith(
        "request body arriving at under 1000 bytes/s after the first 0.05 s (20 bytes in "
    )


def test_the_pace_deadline_moves_with_the_bytes_received() -> None:
    pace = body.Pace(min_bytes_per_s=100, grace_s=2.0)
    assert pace.deadline(10.0, 0) == 12.0
    assert pace.deadline(10.0, 50) == 12.5
    assert body.Pace(0, 2.0).deadline(10.0, 50) is None  # no minimum


def test_a_body_at_the_minimum_rate_is_read_whole() -> None:
    pace = body.Pace(min_bytes_per_s=1, grace_s=60)
    receive = channel({"type": "http.request", "body": b"ab", "more_body": True},
                      {"type": "http.request", "body": b"cd"})  # fmt: skip
    assert asyncio.run(collect(body.read_chunks(receive, 4, pace=pace))) == [
        b"ab",
        b"cd",
        b"",
    ]
