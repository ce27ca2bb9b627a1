"""A request body at the edge, the one place its limits are enforced and the one reader of the
ASGI channel, for every route that takes one: admitted before its first byte, read under its
limits (encoding, declared and received size, upload pace, deadline) and parsed by the route
(``read_request``), or looked at to route it and then read again whole (``peek``), and the
client's leaving after it. Read here, not by Litestar, so a client that disconnects
mid-upload is a ``ClientGone``, not a server error."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from litestar import Request

from clip_gateway.config.settings import ServerSettings
from clip_gateway.errors import BodyTooSlow, ClientGone, LimitExceeded, UnsupportedFormat
from clip_gateway.http.auth import key_of
from clip_gateway.http.context import AppContext
from clip_gateway.imaging.preprocess import Variant
from clip_gateway.pipeline.admission import Reservation

T = TypeVar("T")
Receive = Callable[[], Any]


def admitted(request: Request[Any, Any, Any], context: AppContext, variant: Variant) -> Reservation:
    """The pipeline's admission before the first byte is read, for every route that takes a
    body: a declared length over the limit is refused at once, and the declared size already
    costs its cheapest decode, charged to the request's API key. ``variant``: whose
    preprocessing the request's items get, decided here once for the whole request
    (``immich``: its images decoded Immich's way, every pixel, and priced so)."""
    refuse_oversized(request, context.settings.max_body_bytes)
    return context.pipeline.admit(request.content_length, key_of(request), variant=variant)


#: A route's reading of its body: its content type (media type and parameters), the body's
#: chunks (under every limit: ``body_of``), the settings and the request's reservation (each
#: item added to it as soon as it is complete) -> what the route takes from the body.
Parse = Callable[
    [tuple[str, dict[str, str]], AsyncIterator[bytes], ServerSettings, Reservation], Awaitable[T]
]


async def read_request(
    request: Request[Any, Any, Any],
    settings: ServerSettings,
    reservation: Reservation,
    parse: Parse[T],
) -> T:
    """The body read under its limits and parsed by the route's ``parse`` within the body
    deadline; then it no longer counts as being received. Every route that embeds a body
    reads it so."""
    chunks = body_of(request, settings, reservation)
    parsed = await in_time(settings, parse(request.content_type, chunks, settings, reservation))
    reservation.body_read()
    return parsed


def refuse_oversized(request: Request[Any, Any, Any], limit: int) -> None:
    """413 at once for a declared length over the body limit (nothing of it is read)."""
    declared = request.content_length
    if declared is not None and declared > limit:
        raise LimitExceeded(
            f"request body of {declared} bytes; the limit is {limit}",
            limit=limit,
        )


async def in_time(settings: ServerSettings, reading: Awaitable[T]) -> T:
    """``reading`` (a body being received and parsed) within the body deadline, else 408."""
    try:
        async with asyncio.timeout(settings.body_timeout_s):
            return await reading
    except TimeoutError as exc:
        raise BodyTooSlow(
            f"request body not received within {settings.body_timeout_s:g} s"
        ) from exc


async def by_deadline(
    settings: ServerSettings, deadline: float, chunks: AsyncIterator[bytes]
) -> AsyncIterator[bytes]:
    """``chunks`` (a body passed on as it arrives) each received by ``deadline`` (event-loop
    time: ``body_timeout_s`` after its reading began), else 408, as ``in_time`` bounds a body
    read whole. Only the waits for the client's bytes are bounded: what the consumer does
    between chunks is its own clock's."""
    while True:
        try:
            async with asyncio.timeout_at(deadline):
                chunk = await anext(chunks)
        except StopAsyncIteration:
            return
        except TimeoutError as exc:
            raise BodyTooSlow(
                f"request body not received within {settings.body_timeout_s:g} s"
            ) from exc
        yield chunk


def refuse_encoded(request: Request[Any, Any, Any]) -> None:
    """415 for a compressed body: never decompressed here (images are compressed already)."""
    coding = request.headers.get("content-encoding", "").strip().lower()
    if coding not in ("", "identity"):
        raise UnsupportedFormat(
            f"Content-Encoding {coding!r} is not accepted; send the body uncompressed (images "
            "are compressed already)"
        )


def body_of(
    request: Request[Any, Any, Any],
    settings: ServerSettings,
    reservation: Reservation | None,
) -> AsyncIterator[bytes]:
    """The body's chunks under every limit: no ``Content-Encoding`` (415, never decompressed),
    its size, the minimum upload rate (408), and the bodies in flight, counted on the
    reservation by the bytes as they arrive (429; None: a body passed on unparsed, outside
    admission). Every route that reads a body reads it through this."""
    refuse_encoded(request)
    return read_chunks(
        request.receive,
        settings.max_body_bytes,
        pace=Pace(settings.min_upload_bytes_per_s, settings.upload_grace_s),
        on_bytes=reservation.received if reservation is not None else lambda _: None,
    )


async def peek(
    request: Request[Any, Any, Any],
    settings: ServerSettings,
    look: Callable[[AsyncIterator[bytes]], Awaitable[T]],
    most: int,
) -> T:
    """``look`` at the start of the body, within the body deadline: it reads what it needs of
    the body's chunks, and at most ``most`` bytes (the chunk that passes them included). What
    it read is then read again, from the first byte, by whichever path takes the request (the
    channel's messages it took are put back in front of the rest). Outside admission: nothing
    is counted, the body's size limit applies."""
    receive, taken = request.receive, deque[Any]()

    async def taking() -> Any:
        message = await receive()
        taken.append(message)
        return message

    async def replayed() -> Any:
        return taken.popleft() if taken else await receive()

    chunks = read_chunks(taking, settings.max_body_bytes)
    head = _at_most(chunks, most)
    try:
        return await in_time(settings, look(head))
    finally:
        await head.aclose()
        await chunks.aclose()
        request.receive = replayed


async def _at_most(chunks: AsyncIterator[bytes], most: int) -> AsyncGenerator[bytes, None]:
    seen = 0
    async for chunk in chunks:
        yield chunk
        seen += len(chunk)
        if seen > most:
            return


@dataclass(frozen=True)
class Pace:
    """The slowest upload accepted: after ``grace_s``, ``min_bytes_per_s`` on average."""

    min_bytes_per_s: int
    grace_s: float

    def deadline(self, started: float, received: int) -> float | None:
        """When the next bytes must have arrived (event-loop time), or None: no minimum."""
        if self.min_bytes_per_s <= 0:
            return None
        return started + self.grace_s + received / self.min_bytes_per_s


async def read_chunks(
    receive: Receive,
    limit: int,
    *,
    pace: Pace | None = None,
    on_bytes: Callable[[int], None] = lambda _: None,
) -> AsyncGenerator[bytes, None]:
    """The request body from the ASGI channel, at most ``limit`` bytes; ends with ``b""``.
    ``on_bytes`` hears of every chunk as it arrives (admission counts bodies in flight by the
    bytes received) and may refuse it; a body slower than ``pace`` is ``BodyTooSlow``."""
    loop = asyncio.get_running_loop()
    started, received = loop.time(), 0
    while True:
        deadline = pace.deadline(started, received) if pace else None
        try:
            async with asyncio.timeout_at(deadline):
                message = await receive()
        except TimeoutError as exc:
            assert pace is not None
            raise BodyTooSlow(
                f"request body arriving at under {pace.min_bytes_per_s} bytes/s after the first "
                f"{pace.grace_s:g} s ({received} bytes in {loop.time() - started:.1f} s)"
            ) from exc
        if message["type"] == "http.disconnect":
            raise ClientGone("client disconnected while sending the request body")
        chunk = message.get("body", b"")
        received += len(chunk)
        if received > limit:
            raise LimitExceeded(f"request body over {limit} bytes", limit=limit)
        if chunk:
            on_bytes(len(chunk))
            yield chunk
        if not message.get("more_body"):
            yield b""
            return


async def read_all(chunks: AsyncIterator[bytes]) -> bytearray:
    """The whole body in one buffer, grown as bytes arrive: never sized by a declared length
    (a client that declares 64 MiB and sends one byte holds one byte). Large buffers are
    mmapped (config/memory.py), so growing one remaps it rather than copying."""
    body = bytearray()
    async for chunk in chunks:
        body += chunk
    return body


async def unless_disconnected(
    request: Request[Any, Any, Any], work: Awaitable[T], *, body_read: asyncio.Event | None = None
) -> T:
    """Run ``work``; if the client disconnects first, cancel it (queued decodes, the gRPC call,
    a forward) and raise ``ClientGone`` once it has unwound. ``body_read``: ``work`` reads the
    body itself, and the disconnect is watched for once it is set (the channel has one reader at
    a time).

    ``work`` runs in the request's own task; only the watcher is a task of its own, and a
    disconnect cancels the request's task while ``work`` is pending in it (a task for ``work``
    and a wait on both cost ~10 % of a one-image request's event-loop time, in process)."""
    here = asyncio.current_task()
    assert here is not None, "unless_disconnected runs in a task"
    state = {"running": True, "gone": False}

    def on_disconnect(watcher: asyncio.Future[None]) -> None:
        # a callback scheduled before ``work`` ended may run after: it cancels nothing then. A
        # watcher that failed (the channel broke) means the client is gone as well (its error
        # is not logged as never retrieved: cancel() below, even once done, says it was seen).
        if state["running"] and not watcher.cancelled():
            state["gone"] = True
            here.cancel()

    watcher = asyncio.ensure_future(_disconnected(request, body_read))
    watcher.add_done_callback(on_disconnect)
    try:
        result = await work
    except BaseException:
        # whatever the cancelled work raised on its way out: the client left, and that is
        # what this request ends with, unless someone else cancelled it too
        if state["gone"] and here.uncancel() == 0:
            raise _gone() from None
        raise
    finally:
        state["running"] = False
        watcher.cancel()
    if state["gone"]:  # the work finished though cancelled: its client is gone all the same
        here.uncancel()
        raise _gone()
    return result


def _gone() -> ClientGone:
    return ClientGone("client disconnected; its pending work was cancelled")


async def _disconnected(request: Request[Any, Any, Any], body_read: asyncio.Event | None) -> None:
    if body_read is not None:
        await body_read.wait()
    # The body has been read: the next ASGI message is the disconnect (or never comes).
    while (await request.receive())["type"] != "http.disconnect":
        pass
