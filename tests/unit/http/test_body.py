"""http/body.py: a body read from the ASGI channel under its size limit, its pace and the
admission's count of the bytes as they arrive."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import hashlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from litestar import Litestar, Request

from clip_gateway.config.settings import ServerSettings, load_api_keys
from clip_gateway.errors import (
    BodyTooSlow,
    ClientGone,
    LimitExceeded,
    Overloaded,
    UnsupportedFormat,
)
from clip_gateway.http import body
from clip_gateway.http.app import pipeline_options
from clip_gateway.http.context import KEY, AppContext
from clip_gateway.imaging.paths import current as imaging_path
from clip_gateway.observability.metrics import Metrics
from clip_gateway.observability.tracing import create_telemetry
from clip_gateway.pipeline.admission import MIN_DECODE_S_PER_BYTE
from clip_gateway.pipeline.cache import open_cache
from clip_gateway.pipeline.items import ImageItem
from clip_gateway.pipeline.service import EmbeddingService
from tests import samples
from tests.fakes import FakeBackend

ROOT = Path(__file__).resolve().parents[3]


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


def test_a_minimum_of_one_byte_per_second_is_a_minimum() -> None:
    assert body.Pace(min_bytes_per_s=1, grace_s=2.0).deadline(10.0, 3) == 15.0


def test_the_too_slow_message_says_how_long_the_body_took() -> None:
    pace = body.Pace(min_bytes_per_s=1000, grace_s=0.05)
    receive = stalled_after({"type": "http.request", "body": b"x" * 20, "more_body": True})

    async def scenario() -> tuple[BodyTooSlow, float]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(BodyTooSlow) as slow:
            await collect(body.read_chunks(receive, 100, pace=pace))
        return slow.value, loop.time() - started

    slow, elapsed = asyncio.run(scenario())
    took = re.fullmatch(r".*\(20 bytes in (\d+\.\d) s\)", slow.reason)
    assert took is not None, slow.reason
    # the time since the body began: never more than the whole read took (rounded to 0.1 s)
    assert 0.0 <= float(took.group(1)) <= elapsed + 0.05


# --- at the edge: a real Request (ASGI scope) of a Litestar app holding a real AppContext ---


def context_of(settings: ServerSettings, pool: ThreadPoolExecutor) -> AppContext:
    """The app's context as the lifespan builds it (http/app.py), on the fake backend."""
    pipeline = EmbeddingService(FakeBackend(), pool, pipeline_options(settings, 1),
                                cache=open_cache(settings.cache_mib << 20, None))  # fmt: skip
    return AppContext(
        settings=settings,
        pipeline=pipeline,
        canary=pipeline.canary(0, 0.9, timeout_s=30.0),
        telemetry=create_telemetry("off"),
        metrics=Metrics(),
        api_keys=load_api_keys(settings),
        http=httpx.AsyncClient(),
        imaging=imaging_path(),
    )


@pytest.fixture
def edge() -> Iterator[Callable[[ServerSettings], AppContext]]:
    """Contexts for the settings a test gives, each on an app of its own, closed after."""
    made: list[AppContext] = []
    with ThreadPoolExecutor(1) as pool:

        def make(settings: ServerSettings) -> AppContext:
            made.append(context_of(settings, pool))
            return made[-1]

        yield make
        for context in made:
            asyncio.run(context.http.aclose())


def request_to(
    context: AppContext,
    headers: dict[str, str] | None = None,
    receive: body.Receive | None = None,
) -> Request[Any, Any, Any]:
    """A POST as Litestar hands it to a route: its app (whose state holds ``context``), its
    headers, its ASGI receive channel."""
    app = Litestar()
    app.state[KEY] = context
    scope = {
        "type": "http",
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/embeddings",
        "raw_path": b"/v1/embeddings",
        "root_path": "",
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 50000),
        "state": {},
        "path_params": {},
        "litestar_app": app,
    }
    return Request(scope, receive or channel())  # type: ignore[arg-type]


def test_a_declared_length_over_the_body_limit_is_refused_before_admission(
    edge: Callable[[ServerSettings], AppContext],
) -> None:
    context = edge(ServerSettings(max_body_bytes=2048))
    with pytest.raises(LimitExceeded) as raised:
        body.admitted(request_to(context, {"Content-Length": "2049"}), context, "open_clip")
    assert raised.value.reason == "request body of 2049 bytes; the limit is 2048"
    assert raised.value.extra == {"limit": 2048}
    for declared in ({"Content-Length": "2048"}, {}):  # exactly the limit; none declared
        with body.admitted(request_to(context, declared), context, "open_clip") as reservation:
            assert reservation.admission is context.pipeline.admission


def test_admission_prices_the_declared_length_charges_the_key_and_decodes_by_the_variant(
    edge: Callable[[ServerSettings], AppContext],
) -> None:
    # 32 MiB at the cheapest decode per byte is ~0.13 s on one decode thread: over 0.1 s
    context = edge(ServerSettings(admission_horizon_s=0.1, api_keys=("alpha", "beta")))
    declared = {"Content-Length": str(32 << 20), "Authorization": "Bearer beta"}
    with pytest.raises(LimitExceeded) as raised:
        body.admitted(request_to(context, declared), context, "open_clip")
    assert raised.value.extra["cost_s"] == round((32 << 20) * MIN_DECODE_S_PER_BYTE, 3)
    unsized = {"Authorization": "Bearer beta"}
    with body.admitted(request_to(context, unsized), context, "open_clip") as reservation:
        assert reservation.key == hashlib.sha256(b"beta").hexdigest()[:16]
        assert not reservation.plan.full_size  # open_clip's: scaled decodes
    immich = body.admitted(request_to(context, unsized), context, "immich")
    with immich as reservation:
        assert reservation.plan.full_size  # Immich's: every pixel decoded


def test_a_request_admitted_with_open_clip_finds_what_open_clip_embeddings_cached(
    edge: Callable[[ServerSettings], AppContext],
) -> None:
    context = edge(ServerSettings(cache_mib=1))
    pipeline, item = context.pipeline, ImageItem(samples.compact(0))

    async def scenario() -> None:
        with pipeline.admit(None, variant="open_clip") as first:
            first.add(item)
            first.body_read()
            await pipeline.embed(first, [item])
        with body.admitted(request_to(context), context, "open_clip") as again:
            again.add(item)
            assert id(item) in again.hits

    asyncio.run(scenario())


def test_a_compressed_body_is_refused_naming_its_encoding(
    edge: Callable[[ServerSettings], AppContext],
) -> None:
    context = edge(ServerSettings())
    request = request_to(context, {"Content-Encoding": " GZip "})
    with pytest.raises(UnsupportedFormat) as raised:
        body.body_of(request, context.settings, None)
    assert raised.value.reason == (
        "Content-Encoding 'gzip' is not accepted; send the body uncompressed (images are "
        "compressed already)"
    )
    for plain in ({"Content-Encoding": "Identity"}, {"Content-Encoding": ""}, {}):
        body.refuse_encoded(request_to(context, plain))


def test_a_body_is_read_under_the_settings_limits_counted_on_its_reservation(
    edge: Callable[[ServerSettings], AppContext],
) -> None:
    context = edge(ServerSettings(max_body_bytes=1024))
    settings, admission = context.settings, context.pipeline.admission

    def sending(*sizes: int) -> body.Receive:
        *first, last = sizes
        return channel(
            *({"type": "http.request", "body": b"x" * n, "more_body": True} for n in first),
            {"type": "http.request", "body": b"x" * last},
        )

    async def scenario() -> None:
        with admission.reserve(None) as reservation:
            chunks = body.body_of(request_to(context, receive=sending(1000, 24)), settings,
                                  reservation)  # fmt: skip
            assert await body.read_all(chunks) == b"x" * 1024
            assert reservation.body_bytes == admission.body_bytes_in_flight == 1024
        unparsed = body.body_of(request_to(context, receive=sending(3)), settings, None)
        assert await body.read_all(unparsed) == b"xxx"
        assert admission.body_bytes_in_flight == 0  # a body outside admission is not counted
        over = body.body_of(request_to(context, receive=sending(1000, 25)), settings, None)
        with pytest.raises(LimitExceeded, match=r"^request body over 1024 bytes$"):
            await body.read_all(over)

    asyncio.run(scenario())


def test_a_body_under_the_settings_minimum_rate_is_too_slow_before_its_deadline(
    edge: Callable[[ServerSettings], AppContext],
) -> None:
    settings = ServerSettings(min_upload_bytes_per_s=1000, upload_grace_s=0.05, body_timeout_s=10)
    context = edge(settings)
    receive = stalled_after({"type": "http.request", "body": b"x" * 20, "more_body": True})
    reading = body.read_all(body.body_of(request_to(context, receive=receive), settings, None))
    with pytest.raises(BodyTooSlow) as slow:
        asyncio.run(body.in_time(settings, reading))
    assert slow.value.reason.startswith(
        "request body arriving at under 1000 bytes/s after the first 0.05 s (20 bytes in "
    )


def test_a_body_not_in_by_the_deadline_is_too_slow() -> None:
    settings = ServerSettings(body_timeout_s=0.01)

    async def scenario() -> None:
        assert await body.in_time(settings, asyncio.sleep(0, "parsed")) == "parsed"
        async with asyncio.timeout(10):  # a guard: without a deadline this would never end
            with pytest.raises(BodyTooSlow) as slow:
                await body.in_time(settings, asyncio.Event().wait())
        assert slow.value.reason == "request body not received within 0.01 s"

    asyncio.run(scenario())


def test_a_body_passed_on_is_bounded_only_while_waiting_for_the_client() -> None:
    """``by_deadline``: every chunk passed on in order while each arrives by the deadline; a
    client that sends nothing more by it is too slow, however long the consumer took before."""
    settings = ServerSettings(body_timeout_s=0.05)

    async def stalled() -> AsyncIterator[bytes]:
        yield b"first"
        await asyncio.Event().wait()  # the client sends nothing more
        yield b"never"

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        passed = body.by_deadline(settings, deadline, chunked(b"abcdefgh", 3))
        assert await collect(passed) == [b"abc", b"def", b"gh", b""]
        taken: list[bytes] = []

        async def take(chunks: AsyncIterator[bytes]) -> None:
            async for chunk in chunks:
                taken.append(chunk)

        async with asyncio.timeout(10):  # a guard: without the deadline this would never end
            with pytest.raises(BodyTooSlow) as slow:
                await take(body.by_deadline(settings, loop.time() + 0.05, stalled()))
        assert taken == [b"first"]
        assert slow.value.reason == "request body not received within 0.05 s"

    asyncio.run(scenario())


def client(*messages: dict[str, object]) -> Callable[[], Awaitable[dict[str, object]]]:
    """An ASGI channel after the body: ``messages``, then (as servers do) nothing more, or, once
    a disconnect was sent, that disconnect again, each a loop turn later."""
    queue = list(messages)

    async def receive() -> dict[str, object]:
        await asyncio.sleep(0)
        if not queue:
            await asyncio.Event().wait()
            raise AssertionError("unreachable")
        if queue[0]["type"] == "http.disconnect":
            return queue[0]  # the last: said again to every later receive
        return queue.pop(0)

    return receive


class Work:
    """Pending work (queued decodes, a gRPC call) that finishes after ``turns`` loop turns
    once ``start`` is set, and says whether it was cancelled and let unwind."""

    def __init__(self, turns: int = 20) -> None:
        self.start = asyncio.Event()
        self.turns = turns
        self.cancelled = False

    async def run(self) -> str:
        try:
            await self.start.wait()
            for _ in range(self.turns):
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return "embedded"


def test_work_finished_while_the_client_stays_is_its_answer(
    edge: Callable[[ServerSettings], AppContext],
) -> None:
    context = edge(ServerSettings())

    async def scenario() -> None:
        work = Work()
        work.start.set()
        request = request_to(context, receive=client({"type": "http.request", "body": b""}))
        assert await body.unless_disconnected(request, work.run()) == "embedded"
        assert not work.cancelled

    asyncio.run(scenario())


def test_a_client_that_leaves_first_cancels_its_pending_work(
    edge: Callable[[ServerSettings], AppContext],
) -> None:
    context = edge(ServerSettings())

    async def scenario() -> None:
        work = Work()
        leaving = client({"type": "http.disconnect"})

        async def receive() -> dict[str, object]:
            work.start.set()  # the work would finish some turns after the client left
            return await leaving()

        request = request_to(context, receive=receive)
        with pytest.raises(ClientGone) as gone:
            await body.unless_disconnected(request, work.run())
        assert gone.value.reason == "client disconnected; its pending work was cancelled"
        assert work.cancelled

    asyncio.run(scenario())


def test_a_disconnect_heard_as_the_work_ends_cancels_nothing_after_it(
    edge: Callable[[ServerSettings], AppContext],
) -> None:
    """The work runs in the request's task: a disconnect heard in the turn the work's answer
    came (its callback runs a turn after the work returned) must not cancel what the request
    does next, such as sending that answer."""
    context = edge(ServerSettings())

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        heard, answer = asyncio.Event(), loop.create_future()

        async def receive() -> dict[str, object]:
            await heard.wait()
            return {"type": "http.disconnect"}

        def both() -> None:  # the answer first, then the disconnect, in one turn
            loop.call_soon(answer.set_result, "embedded")
            heard.set()

        async def work() -> str:
            await asyncio.sleep(0)  # the watcher is waiting on the channel now
            loop.call_soon(both)
            return str(await answer)

        request = request_to(context, receive=receive)
        assert await body.unless_disconnected(request, work()) == "embedded"
        here = asyncio.current_task()
        assert here is not None and here.cancelling() == 0
        for _ in range(5):  # the watcher's callback runs in these turns: it cancels nothing
            await asyncio.sleep(0)

    asyncio.run(scenario())


def test_work_that_swallows_the_cancel_still_ends_as_client_gone(
    edge: Callable[[ServerSettings], AppContext],
) -> None:
    context = edge(ServerSettings())

    async def scenario() -> None:
        async def stubborn() -> str:
            with contextlib.suppress(asyncio.CancelledError):  # and finishes anyway
                await asyncio.Event().wait()
            return "embedded"

        request = request_to(context, receive=client({"type": "http.disconnect"}))
        with pytest.raises(ClientGone):
            await body.unless_disconnected(request, stubborn())
        here = asyncio.current_task()
        assert here is not None and here.cancelling() == 0  # no cancel left pending on it
        await asyncio.sleep(0)

    asyncio.run(scenario())


def test_a_request_cancelled_from_outside_stays_cancelled(
    edge: Callable[[ServerSettings], AppContext],
) -> None:
    """Shutdown cancels a request's task: that is a cancellation, not a client that left, even
    when the client leaves too."""
    context = edge(ServerSettings())

    async def scenario() -> None:
        work = Work()
        request = request_to(context, receive=client())
        task = asyncio.ensure_future(body.unless_disconnected(request, work.run()))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert work.cancelled

        work = Work()
        request = request_to(context, receive=client({"type": "http.disconnect"}))
        task = asyncio.ensure_future(body.unless_disconnected(request, work.run()))
        for _ in range(3):  # the disconnect is heard: the task is being cancelled for it
            await asyncio.sleep(0)
        task.cancel()  # and from outside as well
        with pytest.raises(asyncio.CancelledError):
            await task
        assert work.cancelled

    asyncio.run(scenario())


def test_a_broken_channel_ends_the_work_as_a_client_gone(
    edge: Callable[[ServerSettings], AppContext], monkeypatch: pytest.MonkeyPatch
) -> None:
    context = edge(ServerSettings())
    watchers: list[asyncio.Task[None]] = []
    disconnected = body._disconnected

    async def watched(*args: Any) -> None:
        task = asyncio.current_task()
        assert task is not None
        watchers.append(task)
        await disconnected(*args)

    monkeypatch.setattr(body, "_disconnected", watched)

    async def scenario() -> None:
        async def receive() -> dict[str, object]:
            await asyncio.sleep(0)
            raise OSError("connection reset")

        work = Work()
        with pytest.raises(ClientGone):
            await body.unless_disconnected(request_to(context, receive=receive), work.run())
        assert work.cancelled
        [watcher] = watchers
        assert watcher.done() and not watcher.cancelled()

    asyncio.run(scenario())
    # its failure was seen: nothing is left to log "Task exception was never retrieved"
    assert not watchers[0]._log_traceback


# --- one way to read a request: parsed under its limits, or peeked at and read again ---------


def messages_of(*bodies: bytes) -> list[dict[str, object]]:
    *first, last = bodies
    return [*({"type": "http.request", "body": b, "more_body": True} for b in first),
            {"type": "http.request", "body": last, "more_body": False}]  # fmt: skip


def test_a_disconnect_is_watched_for_only_once_the_work_has_read_the_body(
    edge: Callable[[ServerSettings], AppContext],
) -> None:
    """The channel has one reader at a time: work that reads the body itself has every body
    message, and the disconnect is watched for after it says the body is read."""
    context = edge(ServerSettings())
    request = request_to(context, receive=client(*messages_of(b"ab", b"cd", b"ef")))
    body_read = asyncio.Event()

    async def work() -> bytes:
        for _ in range(5):  # turns in which a watcher that did not wait would take messages
            await asyncio.sleep(0)
        whole = await body.read_all(body.read_chunks(request.receive, 1024))
        body_read.set()
        for _ in range(5):
            await asyncio.sleep(0)
        return bytes(whole)

    async def scenario() -> bytes:
        async with asyncio.timeout(10):  # a guard: a watcher that took the body would hang it
            return await body.unless_disconnected(request, work(), body_read=body_read)

    assert asyncio.run(scenario()) == b"abcdef"


def test_a_request_is_read_by_its_routes_parser_then_no_longer_received(
    edge: Callable[[ServerSettings], AppContext],
) -> None:
    context = edge(ServerSettings(max_body_bytes=1024))
    settings, admission = context.settings, context.pipeline.admission
    headers = {"Content-Type": "multipart/form-data; boundary=b"}
    seen: list[object] = []

    async def parse(content_type, chunks, settings_, reservation):  # type: ignore[no-untyped-def]
        whole = await body.read_all(chunks)
        seen.extend([content_type, settings_, reservation, reservation.body_bytes])
        return whole

    async def scenario() -> None:
        receive = channel(*messages_of(b"ab", b"cd"))
        with admission.reserve(None) as reservation:
            request = request_to(context, headers, receive)
            assert await body.read_request(request, settings, reservation, parse) == b"abcd"
            # counted on the reservation as it arrived; then no longer a body being received
            assert seen == [("multipart/form-data", {"boundary": "b"}), settings, reservation, 4]
            assert reservation.body_bytes == admission.body_bytes_in_flight == 0
            assert reservation not in admission._receiving
        compressed = request_to(context, {**headers, "Content-Encoding": "gzip"}, channel())
        with admission.reserve(None) as reservation, pytest.raises(UnsupportedFormat):
            await body.read_request(compressed, settings, reservation, parse)

    asyncio.run(scenario())


def test_a_request_not_parsed_by_the_deadline_is_too_slow(
    edge: Callable[[ServerSettings], AppContext],
) -> None:
    context = edge(ServerSettings(body_timeout_s=0.01))

    async def never(*_: object) -> None:
        await asyncio.Event().wait()

    async def scenario() -> None:
        with context.pipeline.admission.reserve(None) as reservation:
            request = request_to(context, receive=channel())
            async with asyncio.timeout(10):  # a guard: without a deadline this would never end
                with pytest.raises(BodyTooSlow):
                    await body.read_request(request, context.settings, reservation, never)

    asyncio.run(scenario())


def test_a_peek_puts_back_every_message_it_took(
    edge: Callable[[ServerSettings], AppContext],
) -> None:
    """What the look read is read again from the first byte, the very messages the client sent,
    then the rest from the channel."""
    context = edge(ServerSettings())
    sent = messages_of(b"ab", b"cd", b"ef")
    request = request_to(context, receive=channel(*sent))

    async def first_chunk(chunks: AsyncIterator[bytes]) -> bytes:
        return await anext(chunks)

    async def scenario() -> None:
        assert await body.peek(request, context.settings, first_chunk, 100) == b"ab"
        again = [await request.receive() for _ in sent]
        assert again == sent and again[0] is sent[0]  # the message taken, put back as it was

    asyncio.run(scenario())
    replayed = request_to(context, receive=channel(*sent))

    async def again() -> None:
        assert await body.peek(replayed, context.settings, body.read_all, 100) == b"abcdef"
        whole = body.body_of(replayed, context.settings, None)
        assert await body.read_all(whole) == b"abcdef"  # read whole again after a full peek

    asyncio.run(again())


def test_a_peek_reads_at_most_its_bound_and_the_chunk_that_passes_it(
    edge: Callable[[ServerSettings], AppContext],
) -> None:
    context = edge(ServerSettings())
    sent = messages_of(b"a" * 4, b"b" * 4, b"c" * 4, b"d" * 4)
    taken: list[object] = []
    receive = channel(*sent)

    async def counting() -> object:
        taken.append(await receive())
        return taken[-1]

    request = request_to(context, receive=counting)

    async def scenario() -> None:
        assert await body.peek(request, context.settings, body.read_all, 5) == b"aaaabbbb"
        assert len(taken) == 2  # 4 bytes are within 5; the second chunk passes them, and stops
        rest = body.body_of(request, context.settings, None)
        assert await body.read_all(rest) == b"aaaabbbbccccdddd"

    asyncio.run(scenario())
    # at the bound exactly, the next chunk is still read: it is the one that passes it
    for most, seen in ((4, b"aaaabbbb"), (8, b"aaaabbbbcccc"), (16, b"aaaabbbbccccdddd")):
        bounded = request_to(context, receive=channel(*sent))
        peeked = body.peek(bounded, context.settings, body.read_all, most)
        assert asyncio.run(peeked) == seen, most


def test_a_peek_keeps_the_bodys_rules(edge: Callable[[ServerSettings], AppContext]) -> None:
    """A client that leaves while it is looked at is gone, one that stalls is too slow (within
    the body deadline), one over the body limit is refused."""
    context = edge(ServerSettings(body_timeout_s=0.05, max_body_bytes=1024))
    settings = context.settings
    gone = request_to(context, receive=channel(*messages_of(b"a", b"")[:1],
                                               {"type": "http.disconnect"}))  # fmt: skip
    with pytest.raises(ClientGone):
        asyncio.run(body.peek(gone, settings, body.read_all, 100))
    stalled = request_to(context, receive=stalled_after(*messages_of(b"a", b"")[:1]))
    with pytest.raises(BodyTooSlow):
        asyncio.run(body.peek(stalled, settings, body.read_all, 100))
    large = request_to(context, receive=channel(*messages_of(b"a" * 1000, b"b" * 25)))
    with pytest.raises(LimitExceeded):
        asyncio.run(body.peek(large, settings, body.read_all, 2048))


def test_only_the_body_module_reads_the_channel() -> None:
    """No module of the gateway but http/body.py calls an ASGI ``receive`` or replaces a
    request's (middleware passes the channel on; it never reads it)."""
    readers = set()
    for path in sorted((ROOT / "clip_gateway").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            called = isinstance(node, ast.Call) and (
                getattr(node.func, "id", None) == "receive"
                or getattr(node.func, "attr", None) == "receive"
            )
            replaced = isinstance(node, ast.Assign) and any(
                getattr(target, "attr", None) == "receive" for target in node.targets
            )
            if called or replaced:
                readers.add(path.relative_to(ROOT).as_posix())
    assert sorted(readers) == ["clip_gateway/http/body.py"]
