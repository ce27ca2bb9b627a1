"""Request bodies to items: multipart parts in order, or the OpenAI JSON shape.

Which items are texts and which images (README "Texts and images"): in JSON a string is a text
unless it is a ``data:image/...`` URI or ``modality`` is ``image``; ``{"text": ...}`` and
``{"image": ...}`` objects say what they are. A bare string that is base64 of a JPEG, PNG, WebP
or GIF without ``modality`` is refused as ambiguous rather than embedded as text (clients of
the image-only API sent images that way). In multipart, ``text`` fields are texts and every
other part that is not an option is an image.

Bounded while reading, before objects are built: the body's bytes (read from the ASGI channel
here, so a client that disconnects mid-upload is a ``ClientGone``, not a server error), the
number of parts and each part's size (the multipart parser's own limits), and in JSON the
number of items and each string's length (msgspec checks them while decoding). Each image part
is reported as soon as it is complete (``on_item``, the request's ``Reservation.add``) so
admission can stop reading a body whose cost no longer fits. Items come out typed: an
``ImageItem`` (raw bytes, or the base64 text JSON carried) or a ``TextItem``.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import msgspec
from multipart import MultipartSegment, ParserError, ParserLimitReached, PushMultipartParser

from clip_gateway.errors import (
    BodyTooSlow,
    ClientGone,
    InvalidFields,
    LimitExceeded,
    MalformedRequest,
)
from clip_gateway.http.schemas import (
    FORM_OPTIONS,
    EmbeddingRequest,
    EncodingFormat,
    InputObject,
    Modality,
)
from clip_gateway.pipeline.items import ImageItem, Item, TextItem

Receive = Callable[[], Any]

#: Multipart fields that are options, not items. ``text`` fields are texts; every other part is
#: an image, in order.
OPTION_FIELDS = frozenset(FORM_OPTIONS)
TEXT_FIELD = "text"
#: Base64 of the first bytes of a JPEG, PNG, WebP (RIFF) and GIF.
_BASE64_IMAGE_STARTS = ("/9j/", "iVBORw0KGgo", "UklGR", "R0lGOD")
_BASE64 = re.compile(r"[A-Za-z0-9+/\r\n]{24,}={0,2}\s*")


@dataclass(frozen=True)
class ParsedRequest:
    items: list[Item]
    model: str | None
    encoding_format: EncodingFormat | None
    normalize: bool | None
    skip_invalid: bool | None = None
    dimensions: int | None = None


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


async def body_chunks(
    receive: Receive,
    limit: int,
    *,
    pace: Pace | None = None,
    on_bytes: Callable[[int], None] = lambda _: None,
) -> AsyncIterator[bytes]:
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
        if not message.get("more_body", False):
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


def _encoded_chars(max_bytes: int) -> int:
    """Characters a base64 string of ``max_bytes`` takes, plus room for a ``data:`` header."""
    return 4 * -(-max_bytes // 3) + 256


@cache
def _envelope() -> type[EmbeddingRequest]:
    """EmbeddingRequest with ``input`` left raw: msgspec skips over it (no object is built) so
    its items can be counted and measured before any is decoded."""
    fields: list[Any] = [("input", msgspec.Raw)]
    for field in msgspec.structs.fields(EmbeddingRequest)[1:]:
        fields.append((field.name, field.type, field.default))
    envelope = msgspec.defstruct("EmbeddingRequest", fields, forbid_unknown_fields=False)
    return envelope  # type: ignore[return-value]


_INPUT = msgspec.structs.fields(EmbeddingRequest)[0].type
#: One JSON token: a string (escapes allowed, scanned at C speed), a bracket, a comma or colon,
#: or a bare scalar.
_TOKEN = re.compile(rb'\s*("[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{},:]|[^\s\[\]{},:"]+)')
_OPEN, _CLOSE, _SEPARATORS, _QUOTE = frozenset(b"[{"), frozenset(b"]}"), frozenset(b",:"), 34


def _scan_input(raw: memoryview, max_items: int, max_chars: int) -> None:
    """Refuse too many items or an over-long string in ``input`` from its raw bytes, stopping
    at the first item over a limit: a few hundred regex steps at most, whatever the body."""
    kind = bytes(raw[:1])
    if kind == b'"':
        if len(raw) - 2 > max_chars:
            raise LimitExceeded(f"item over {max_chars} characters", index=0)
        return
    if kind != b"[":
        return  # not a string or a list: msgspec reports the type error
    depth, items, pos = 0, 0, 0
    for _ in range(16 * (max_items + 2)):
        token = _TOKEN.match(raw, pos)  # positions only: a token's bytes are never copied
        if token is None:
            return  # malformed: msgspec reports it
        pos, start = token.end(), token.start(1)
        lead = raw[start]
        if lead in _OPEN:
            depth += 1
            items += depth == 2  # an object or list item starts
        elif lead in _CLOSE:
            depth -= 1
            if depth == 0:
                return
        elif lead not in _SEPARATORS:
            items += depth == 1  # a scalar item
            if lead == _QUOTE and pos - start - 2 > max_chars:  # any string inside an item
                raise LimitExceeded(f"item over {max_chars} characters", index=max(items - 1, 0))
        if items > max_items:
            raise LimitExceeded(
                f"more than {max_items} items in one request; the limit is {max_items}",
                index=max_items,
            )
    raise MalformedRequest("input nests too deep or holds too many tokens")


#: A high surrogate escape not followed by a low one, or a low one not preceded by a high one.
_LONE_SURROGATE = re.compile(
    rb"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    rb"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)
_INPUT_KEY = re.compile(rb'"input"\s*:\s*')


def _lone_surrogate_item(body: bytes | bytearray) -> int | None:
    """The index of the ``input`` item holding the first lone surrogate escape, if any (msgspec
    reports one as a truncated or malformed document, not naming the item)."""
    found = _LONE_SURROGATE.search(body)
    key = _INPUT_KEY.search(body)
    if found is None or key is None or found.start() < key.end():
        return None
    raw, offset = memoryview(body), key.end()
    if raw[offset] != ord("["):
        return 0  # a single string
    depth, items, pos = 0, 0, offset
    while pos < found.start():
        token = _TOKEN.match(raw, pos)
        if token is None:
            break
        pos, lead = token.end(), raw[token.start(1)]
        if lead in _OPEN:
            depth += 1
            items += depth == 2
        elif lead in _CLOSE:
            depth -= 1
        elif lead not in _SEPARATORS:
            items += depth == 1
    return max(items - 1, 0)


def parse_json(body: bytes | bytearray, max_images: int, max_image_bytes: int) -> ParsedRequest:
    """The OpenAI embeddings request: ``max_images`` bounds the items (texts included), and
    ``max_image_bytes`` the length of any string (texts have their own, smaller limit, checked
    where they are embedded so ``skip_invalid`` can report them one by one)."""
    max_chars = _encoded_chars(max_image_bytes)
    try:
        request = msgspec.json.decode(body, type=_envelope())
        _scan_input(memoryview(request.input), max_images, max_chars)  # type: ignore[arg-type]
        value = msgspec.json.decode(request.input, type=_INPUT)  # type: ignore[arg-type]
    except msgspec.ValidationError as exc:
        raise InvalidFields(f"invalid embeddings request: {exc}") from exc
    except msgspec.DecodeError as exc:
        index = _lone_surrogate_item(body)
        if index is not None:
            raise MalformedRequest(
                f"input[{index}] has a lone UTF-16 surrogate escape (\\ud800-\\udfff without "
                "its pair): not a Unicode character; send valid UTF-8 or a surrogate pair",
                index=index,
            ) from None
        raise MalformedRequest(f"malformed JSON: {exc}") from exc
    except RecursionError as exc:  # msgspec's own guard against hostile nesting
        raise MalformedRequest("malformed JSON: nested too deep") from exc
    items = _items([value] if isinstance(value, str) else value, request.modality)
    _check_count(len(items), max_images)
    return ParsedRequest(
        items,
        request.model,
        request.encoding_format,
        request.normalize,
        request.skip_invalid,
        request.dimensions,
    )


def _items(values: list[str | InputObject], modality: Modality | None) -> list[Item]:
    items: list[Item] = []
    for index, value in enumerate(values):
        if isinstance(value, InputObject):
            items.append(_object_item(value, index, modality))
        elif modality == "image" or (modality is None and value[:11].lower() == "data:image/"):
            items.append(ImageItem.encoded(value))
        elif modality is None and _looks_like_base64_image(value):
            raise InvalidFields(
                f"input[{index}] looks like a base64-encoded image, not a text: send it as a "
                'data:image/...;base64, URI or an {"image": ...} object, or set '
                '"modality": "image"',
                index=index,
            )
        else:
            items.append(TextItem(value))
    return items


def _object_item(value: InputObject, index: int, modality: Modality | None) -> Item:
    has_text, has_image = value.text is not msgspec.UNSET, value.image is not msgspec.UNSET
    if has_text == has_image:
        raise InvalidFields(
            f'input[{index}] must have exactly one of "text" or "image"', index=index
        )
    kind = "text" if has_text else "image"
    if modality is not None and modality != kind:
        raise InvalidFields(
            f'input[{index}] is an {{"{kind}": ...}} object but "modality" is {modality!r}',
            index=index,
        )
    if isinstance(value.text, str):
        return TextItem(value.text)
    return ImageItem.encoded(str(value.image))


def _looks_like_base64_image(value: str) -> bool:
    return value.startswith(_BASE64_IMAGE_STARTS) and _BASE64.fullmatch(value) is not None


async def parse_multipart(
    chunks: AsyncIterator[bytes],
    boundary: str,
    *,
    max_images: int,
    max_image_bytes: int,
    on_item: Callable[[Item], None] = lambda _: None,
) -> ParsedRequest:
    """Stream-parse the body, keeping items in arrival order: ``text`` fields are texts, other
    parts (whatever their field names) images."""
    items: list[Item] = []
    options: dict[str, str] = {}
    segment: MultipartSegment | None = None
    buffer = bytearray()
    parser = PushMultipartParser(
        boundary,
        max_segment_count=max_images + len(OPTION_FIELDS),
        max_segment_size=max_image_bytes,
        max_header_count=16,
    )
    try:
        async for chunk in chunks:
            for event in parser.parse(chunk):
                if isinstance(event, MultipartSegment):
                    segment, buffer = event, bytearray()
                elif event is not None:
                    buffer += event
                elif segment is not None:
                    item: Item
                    if segment.name in OPTION_FIELDS and not segment.filename:
                        options[segment.name] = _text(buffer, segment).strip()
                        continue
                    if segment.name == TEXT_FIELD:
                        item = TextItem(_text(buffer, segment))
                    else:
                        item = ImageItem(bytes(buffer))
                    on_item(item)  # may refuse: the rest is never read
                    items.append(item)
            if not chunk:
                break
        parser.close()
    except ParserLimitReached as exc:
        raise LimitExceeded(
            f"multipart limit reached at part {len(items)}: {exc} (at most {max_images} items, "
            f"each part at most {max_image_bytes} bytes)",
            index=len(items),
        ) from exc
    except ParserError as exc:
        raise MalformedRequest(f"malformed multipart body: {exc}") from exc
    _check_count(len(items), max_images)
    return ParsedRequest(
        items,
        options.get("model"),
        _encoding_format(options.get("encoding_format")),
        _flag(options.get("normalize"), "normalize"),
        _flag(options.get("skip_invalid"), "skip_invalid"),
    )


def _text(buffer: bytearray, segment: MultipartSegment) -> str:
    charset = segment.charset or "utf-8"
    try:
        return buffer.decode(charset)
    except (LookupError, UnicodeDecodeError) as exc:
        raise MalformedRequest(f"form field {segment.name!r} is not valid {charset}") from exc


def _check_count(count: int, max_images: int) -> None:
    if count == 0:
        raise MalformedRequest("no items (images or texts) in the request")
    if count > max_images:
        raise LimitExceeded(
            f"{count} items in one request; the limit is {max_images}", index=max_images
        )


def _encoding_format(value: str | None) -> EncodingFormat | None:
    if value is None or value in ("float", "base64"):
        return value  # type: ignore[return-value]
    raise MalformedRequest(f"encoding_format must be 'float' or 'base64', not {value!r}")


def _flag(value: str | None, name: str) -> bool | None:
    if value is None:
        return None
    lowered = value.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise MalformedRequest(f"{name} must be true or false, not {value!r}")
