"""Immich's own ML server behind this one (``GATEWAY_IMMICH_UPSTREAM``; docs/IMMICH.md): every
``/predict`` but one CLIP encoding of a served model goes there, unchanged. What decides is the
form's ``entries`` field (Immich sends it first), read by the form reader with a stop, outside
admission and bounded (http/body.py's ``peek`` puts back what it read for whichever path then
takes the request); the forward streams the body there (http/immich/upstream.py). The upstream
client lives on app.state for the app's life (``opened``, in the app's lifespan).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from litestar import Request
from litestar.datastructures import State
from multipart import MultipartSegment, ParserError, ParserLimitReached

from clip_gateway.config.settings import ServerSettings
from clip_gateway.errors import LimitExceeded
from clip_gateway.http import forms
from clip_gateway.http.body import (
    body_of,
    by_deadline,
    peek,
    refuse_encoded,
    refuse_oversized,
    unless_disconnected,
)
from clip_gateway.http.immich.form import served_here
from clip_gateway.http.immich.upstream import Relayed, Upstream, request_headers

#: The most of a body read before ``entries`` must have been seen; a form that puts it later
#: (Immich never does) is forwarded: the upstream serves everything.
PEEK_BYTES = 64 << 10
#: The parser's own limits: a form whose parts have more or longer headers than it takes is
#: forwarded for the upstream to answer.
PEEK_LIMITS = forms.Limits()
#: The upstream client's key on app.state.
KEY = "immich_upstream"


@contextlib.asynccontextmanager
async def opened(state: State, settings: ServerSettings) -> AsyncIterator[None]:
    """Immich's upstream client on ``state`` while this runs (when one is configured), each
    upstream's ``/ping`` watched meanwhile; closed at the end."""
    if not (settings.immich and settings.immich_upstream):
        yield
        return
    upstream = Upstream(
        settings.immich_upstream,
        settings.immich_upstream_timeout_s,
        settings.immich_upstream_concurrency,
    )
    state[KEY] = upstream
    watch = asyncio.create_task(upstream.watch())
    try:
        yield
    finally:
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch
        await upstream.aclose()


def upstream_of(state: State) -> Upstream | None:
    """The app's upstream client (None: none is configured)."""
    upstream = state.get(KEY)
    assert upstream is None or isinstance(upstream, Upstream)
    return upstream


async def elsewhere(
    request: Request[Any, Any, Any], settings: ServerSettings, upstream: Upstream
) -> Relayed | None:
    """The upstream's answer to a request not served here, or None: served here (the body then
    read from its first byte)."""
    refuse_encoded(request)
    refuse_oversized(request, settings.max_body_bytes)
    # one body deadline for the part read to decide and the rest, however it is read
    deadline = asyncio.get_running_loop().time() + settings.body_timeout_s
    if served_here(await entries_of(request, settings), settings):
        return None
    return await forward(request, settings, upstream, deadline)


async def entries_of(request: Request[Any, Any, Any], settings: ServerSettings) -> bytes | None:
    """The form's ``entries`` when it is in the body's first ``PEEK_BYTES``; None when it is not,
    or the body is not a form the reader takes (the upstream's to answer)."""
    _, options = request.content_type
    boundary = options.get("boundary")
    if not boundary:
        return None
    fields = _Entries()
    await peek(
        request,
        settings,
        lambda chunks: forms.read_form(chunks, boundary, fields, PEEK_LIMITS),
        PEEK_BYTES,
    )
    return fields.found


@dataclass(frozen=True)
class _Seen:
    entries: bool
    limit: None = None

    def too_large(self) -> LimitExceeded:  # never called: no limit of its own
        raise AssertionError("a part read to route a request has no limit of its own")


_ENTRIES, _OTHER = _Seen(True), _Seen(False)


class _Entries:
    """The form reader's stop: the ``entries`` field, then nothing more."""

    found: bytes | None = None

    def begin(self, segment: MultipartSegment) -> _Seen:
        return _ENTRIES if segment.name == "entries" else _OTHER

    def end(self, part: _Seen, data: bytes) -> bool:
        if part.entries:
            self.found = data
        return part.entries

    def refused(self, exc: ParserError | ParserLimitReached) -> None:
        return None  # not a form it can read: the upstream's to answer


async def forward(
    request: Request[Any, Any, Any], settings: ServerSettings, upstream: Upstream, deadline: float
) -> Relayed:
    """The request to the upstream as it arrives (under the body limit, the upload pace and
    the body ``deadline``, never parsed or re-encoded), and the upstream's status, headers and
    body back. A slot is held from here until the client has taken the answer; a client
    that leaves once its body is sent cancels the forward at once."""
    headers = request_headers(request.scope["headers"], request.content_length)
    slot = upstream.slot()
    try:
        body_read = asyncio.Event()
        chunks = by_deadline(settings, deadline, body_of(request, settings, None))
        answer = await unless_disconnected(
            request, upstream.forward(headers, _noting_end(chunks, body_read)), body_read=body_read
        )
    except BaseException:
        slot.release()
        raise
    return Relayed(answer, slot)


async def _noting_end(chunks: AsyncIterator[bytes], end: asyncio.Event) -> AsyncIterator[bytes]:
    async for chunk in chunks:
        yield chunk
    end.set()
