"""Immich's machine-learning protocol (``GATEWAY_IMMICH``; docs/IMMICH.md): ``GET /ping``,
``GET /`` and ``POST /predict`` as Immich's server calls them (``immich_ml/main.py``,
``machine-learning.repository.ts``), on the same admission, pipeline, batching, metrics and
error map as ``/v1/embeddings``. Answers keep Immich's shapes; statuses come from the map:
malformed ``entries`` 422, neither image nor text 400, faces/OCR/several tasks 501, a model
name not served 409, so Immich's server tries the next URL in its list and never stores
another model's vector. With an upstream (``GATEWAY_IMMICH_UPSTREAM``, http/upstream.py) every
``/predict`` but one CLIP encoding of a served model goes there instead, unchanged: the route
reads the form's ``entries`` first (Immich sends it first), outside admission and bounded, and
decides.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
from litestar import MediaType, Request, Response, get, post
from litestar.datastructures import State
from litestar.types import Receive, ReceiveMessage
from multipart import MultipartSegment, ParserError, ParserLimitReached, PushMultipartParser

from clip_gateway.config.settings import ServerSettings
from clip_gateway.errors import (
    ClientGone,
    InvalidFields,
    LimitExceeded,
    MalformedRequest,
    OtherModel,
    UnsupportedTask,
)
from clip_gateway.http.auth import PUBLIC
from clip_gateway.http.body import (
    admitted,
    body_of,
    by_deadline,
    in_time,
    refuse_encoded,
    refuse_oversized,
    unless_disconnected,
)
from clip_gateway.http.context import AppContext, app_context
from clip_gateway.http.encoding import JSON_MEDIA_TYPE
from clip_gateway.http.parsing import MAX_BYTES_PER_CHAR, decode_text, text_codec
from clip_gateway.http.upstream import Relayed, Upstream, request_headers
from clip_gateway.pipeline.admission import Reservation
from clip_gateway.pipeline.items import ImageItem, Item, TextItem

#: Immich's ``entries`` for one CLIP call is under 100 bytes; anything near this is not Immich.
#: The same bound holds any other form field (an ``assetId``), read and dropped.
MAX_ENTRIES_BYTES = 16 << 10
#: Parts in one /predict body: entries, image or text, and a few Immich may add (``assetId``).
MAX_PARTS = 8
#: What each CLIP model type needs from the form.
NEEDS = {"visual": "image", "textual": "text"}
_TEXT = "form field 'text'"
#: With an upstream, the most of a body read before ``entries`` must have been seen; a form
#: that puts it later (Immich never does) is forwarded: the upstream serves everything.
PEEK_BYTES = 64 << 10
#: Immich's ``clean_name`` (``immich_ml/config.py``): the last path segment of a model name,
#: ``:`` ``\\`` ``/`` made ``_``, ``.`` dropped: ``immich-app/ViT-B-32__openai`` is that model.
_CLEAN_NAME = str.maketrans(":\\/", "___", ".")


@get("/", include_in_schema=False, opt={PUBLIC: True}, security=[{}])
async def immich_root() -> dict[str, str]:
    """What Immich's ML server answers at its root."""
    return {"message": "Immich ML"}


@get("/ping", media_type=MediaType.TEXT, include_in_schema=False, opt={PUBLIC: True},
     security=[{}])  # fmt: skip
async def immich_ping() -> str:
    """Immich's availability probe (2 s timeout): the process answers; never calls Triton, so a
    busy GPU does not make Immich mark this URL unhealthy."""
    return "pong"


@post("/predict", include_in_schema=False, status_code=200)
async def immich_predict(request: Request[Any, Any, Any], state: State) -> Response[bytes]:
    """One CLIP encoding, Immich's way: an ``entries`` form field naming the task, and an
    ``image`` part (a preview, JPEG or WebP, found by content) or a ``text`` field; with an
    upstream, anything else is forwarded there."""
    context = app_context(state)
    if context.upstream is not None:
        refuse_encoded(request)
        refuse_oversized(request, context.settings.max_body_bytes)
        # one body deadline for the part read to decide and the rest, however it is read
        deadline = asyncio.get_running_loop().time() + context.settings.body_timeout_s
        head = await in_time(context.settings, peek(request))
        request.receive = head.replay(request.receive)
        if not served_here(head.entries, context.settings):
            return await forward(request, context, context.upstream, deadline)
    return await serve(request, context)


async def serve(request: Request[Any, Any, Any], context: AppContext) -> Response[bytes]:
    settings, pipeline = context.settings, context.pipeline
    # the same admission as /v1/embeddings: bodies counted as they arrive, images priced by the
    # decode work their headers promise, each API key within its share
    with admitted(request, context, variant="immich") as reservation:
        with context.telemetry.tracer.start_as_current_span("receive"):
            form = await read_form(request, settings, reservation)
        kind, item = check_form(form, settings)
        is_text = isinstance(item, TextItem)
        request.state.images, request.state.texts = int(not is_text), int(is_text)
        result = await unless_disconnected(
            request, pipeline.embed(reservation, [item], variant="immich")
        )
    body: dict[str, Any] = {"clip": msgspec.json.encode(result.vectors[0].tolist()).decode()}
    if kind == "visual":  # decoded, or answered from the cache with the size it had then
        width, height = result.image_sizes[0]
        body["imageHeight"], body["imageWidth"] = height, width
    return Response(msgspec.json.encode(body), media_type=JSON_MEDIA_TYPE)


@dataclass
class Head:
    """The start of a body, read to find ``entries``: the ASGI messages, replayed in front of
    the rest to whichever path takes the request."""

    messages: list[ReceiveMessage] = field(default_factory=list)
    entries: bytes | None = None

    def replay(self, receive: Receive) -> Receive:
        pending = deque(self.messages)

        async def replayed() -> ReceiveMessage:
            return pending.popleft() if pending else await receive()

        return replayed


async def peek(request: Request[Any, Any, Any]) -> Head:
    """The body up to its ``entries`` field (at most ``PEEK_BYTES`` of it): what decides where
    the request goes. Any body it cannot read as a form is left for the upstream to answer."""
    head = Head()
    _, options = request.content_type
    boundary = options.get("boundary")
    parser = PushMultipartParser(boundary) if boundary else None
    seen, name, buffer = 0, None, bytearray()
    while seen <= PEEK_BYTES:
        message = await request.receive()
        if message["type"] != "http.request":
            raise ClientGone("client disconnected while sending the request body")
        head.messages.append(message)
        chunk = message.get("body", b"")
        seen += len(chunk)
        try:
            for event in parser.parse(chunk) if parser is not None else ():
                if isinstance(event, MultipartSegment):
                    name, buffer = event.name, bytearray()
                elif event is not None:
                    buffer += event
                elif name == "entries":
                    head.entries = bytes(buffer)
                    return head
        except (ParserError, ParserLimitReached):  # not a form it can read (a part with more
            return head  # or longer headers than the parser takes): the upstream's to answer
        if not message.get("more_body", False):
            return head
    return head


def served_here(entries: bytes | None, settings: ServerSettings) -> bool:
    """One CLIP encoding of a model served here; everything else is the upstream's. A mixed
    request goes there whole, as Immich's server answers one (docs/IMMICH.md)."""
    if entries is None:
        return False
    try:
        tasks = parse_entries(entries)
    except InvalidFields:
        return False  # the upstream answers it as Immich does (422)
    if len(tasks) != 1:
        return False
    task, kind, name = tasks[0]
    return task == "clip" and kind in NEEDS and clean_name(name) in settings.immich_names


def clean_name(name: str) -> str:
    """A model name as Immich's ML server reads it (``immich_ml/config.py``'s ``clean_name``)."""
    return name.split("/")[-1].translate(_CLEAN_NAME)


async def forward(
    request: Request[Any, Any, Any], context: AppContext, upstream: Upstream, deadline: float
) -> Relayed:
    """The request to the upstream as it arrives (under the body limit, the upload pace and
    the body ``deadline``, never parsed or re-encoded), and the upstream's status, headers and
    body back. A slot is held from here until the client has taken the answer; a client
    that leaves once its body is sent cancels the forward at once."""
    headers = request_headers(request.scope["headers"], request.content_length)
    slot = upstream.slot()
    try:
        body_read = asyncio.Event()
        chunks = by_deadline(context.settings, deadline, body_of(request, context.settings, None))
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


class Form(msgspec.Struct):
    entries: bytes | None = None
    image: ImageItem | None = None
    text: TextItem | None = None


async def read_form(
    request: Request[Any, Any, Any], settings: ServerSettings, reservation: Reservation
) -> Form:
    """The form, read within the body deadline; then the body no longer counts as being received."""
    form = await in_time(settings, _read_form(request, settings, reservation))
    reservation.body_read()
    return form


async def _read_form(
    request: Request[Any, Any, Any], settings: ServerSettings, reservation: Reservation
) -> Form:
    media_type, options = request.content_type
    if media_type != "multipart/form-data" or not options.get("boundary"):
        raise InvalidFields(
            "Immich's /predict takes multipart/form-data with an `entries` field, "
            f"not {media_type or '(no Content-Type)'}"
        )
    chunks = body_of(request, settings, reservation)
    return await parse_form(chunks, options["boundary"], settings, reservation)


async def parse_form(
    chunks: AsyncIterator[bytes],
    boundary: str,
    settings: ServerSettings,
    reservation: Reservation,
) -> Form:
    """The form's ``entries``, ``image`` and ``text``, each bounded while it streams in (other
    fields are read and dropped); the image or text is admitted as soon as it is complete."""
    # the image up to the image limit; the text to what max_text_chars can take in UTF-8;
    # anything else (entries, an assetId) is small
    limits = {
        "image": settings.max_image_bytes,
        "text": settings.max_text_chars * MAX_BYTES_PER_CHAR,
    }
    form = Form()
    parser = PushMultipartParser(
        boundary,
        max_segment_count=MAX_PARTS,
        max_segment_size=max(settings.max_image_bytes, MAX_ENTRIES_BYTES),
        max_header_count=16,
    )
    segment: MultipartSegment | None = None
    buffer = bytearray()
    try:
        async for chunk in chunks:
            for event in parser.parse(chunk):
                if isinstance(event, MultipartSegment):
                    segment, buffer = event, bytearray()
                    if segment.name == "text":  # its charset refused before its bytes are read
                        text_codec(segment.charset, _TEXT)
                elif event is not None:
                    buffer += event
                    assert segment is not None
                    limit = limits.get(segment.name, MAX_ENTRIES_BYTES)
                    if len(buffer) > limit:
                        raise LimitExceeded(
                            f"form field {segment.name!r} is over its {limit} bytes", limit=limit
                        )
                elif segment is not None:
                    _complete(form, segment, buffer, reservation)
            if not chunk:
                break
        parser.close()
    except ParserLimitReached as exc:
        raise LimitExceeded(f"multipart limit reached: {exc}") from exc
    except ParserError as exc:
        raise MalformedRequest(f"malformed multipart body: {exc}") from exc
    return form


def _complete(
    form: Form, segment: MultipartSegment, buffer: bytearray, reservation: Reservation
) -> None:
    name = segment.name
    if name in ("entries", "image", "text") and getattr(form, name) is not None:
        raise MalformedRequest(f"form field {name!r} given twice")
    if name == "entries":
        form.entries = bytes(buffer)
    elif name == "image":
        form.image = ImageItem(bytes(buffer))
        reservation.add(form.image)
    elif name == "text":
        form.text = TextItem(_decode_text(buffer, segment))
        reservation.add(form.text)


def _decode_text(buffer: bytearray, segment: MultipartSegment) -> str:
    return decode_text(buffer, text_codec(segment.charset, _TEXT), _TEXT)


def check_form(form: Form, settings: ServerSettings) -> tuple[str, Item]:
    """The model type asked for (``visual``/``textual``) and its item, or the reason why not,
    in the order Immich's own server checks: entries (422), an input at all (400), then the
    task (501) and the model name (409)."""
    if form.entries is None:
        raise InvalidFields("the `entries` form field is missing (Immich's task description)")
    tasks = parse_entries(form.entries)
    if form.image is None and form.text is None:
        raise MalformedRequest("Either image or text must be provided")
    if len(tasks) != 1 or tasks[0][:2] not in (("clip", "visual"), ("clip", "textual")):
        asked = ", ".join(f"{task}.{kind}" for task, kind, _ in tasks)
        raise UnsupportedTask(
            f"this gateway serves one CLIP encoding per request (clip.visual or clip.textual), "
            f"not {asked}: Immich's next machine-learning URL serves it"
        )
    _, kind, name = tasks[0]
    if clean_name(name) not in settings.immich_names:
        served = ", ".join(settings.immich_names) or "no Immich name (GATEWAY_IMMICH_ALIASES)"
        raise OtherModel(f"model {name!r} is not served here; served: {served}")
    if kind == "visual":
        if form.image is None:
            raise MalformedRequest("clip.visual needs an `image` part")
        return kind, form.image
    if form.text is None:
        raise MalformedRequest("clip.textual needs a `text` field")
    return kind, form.text


def parse_entries(raw: bytes) -> list[tuple[str, str, str]]:
    """``{task: {type: {"modelName": ..., "options": {...}}}}`` as (task, type, modelName)
    triples; anything else is 422, as Immich's ``get_entries`` answers."""
    try:
        request = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise InvalidFields(f"`entries` is not JSON: {exc}") from exc
    except UnicodeDecodeError as exc:  # msgspec's answer to invalid UTF-8 inside a string
        raise InvalidFields(
            f"`entries` is not valid UTF-8 ({exc.reason} in a string): JSON text must be UTF-8"
        ) from None
    except RecursionError as exc:  # 16 KiB of brackets nest deeper than the decoder recurses
        raise InvalidFields("`entries` nests too deeply") from exc
    if not isinstance(request, dict) or not request:
        raise InvalidFields('`entries` must be an object such as {"clip": {"visual": {...}}}')
    out = []
    for task, types in request.items():
        if not isinstance(types, dict) or not types:
            raise InvalidFields(f"`entries.{task}` must be an object of model types")
        for kind, entry in types.items():
            if not isinstance(entry, dict) or not isinstance(entry.get("modelName"), str):
                raise InvalidFields(f"`entries.{task}.{kind}` needs a `modelName` string")
            if not isinstance(entry.get("options", {}), dict):
                raise InvalidFields(f"`entries.{task}.{kind}.options` must be an object")
            out.append((task, kind, entry["modelName"]))
    return out


@get("/immich/upstream", include_in_schema=False)
async def immich_upstream(state: State) -> dict[str, Any]:
    """Each configured upstream as its ``/ping`` answers now: ``up`` or ``down`` and why (in
    fixed words: never an address beyond the configured URL)."""
    upstream = app_context(state).upstream
    assert upstream is not None  # the route exists only with one
    await upstream.ping_all()
    return {
        "upstreams": [
            {"url": s.url, "state": s.state, **({"detail": s.detail} if s.detail else {})}
            for s in upstream.states
        ],
        "forwards_in_flight": upstream.in_flight,
    }


ROUTES = [immich_root, immich_ping, immich_predict]


def routes(settings: ServerSettings) -> list[Any]:
    """Immich's routes, and the upstream's status route when one is configured."""
    return [*ROUTES, immich_upstream] if settings.immich_upstream else ROUTES
