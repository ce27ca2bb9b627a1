"""Request bodies to items: multipart parts in order, or the OpenAI JSON shape.

Bounded while reading, before objects are built: the body's bytes (read from the ASGI channel
here, so a client that disconnects mid-upload is a ``ClientGone``, not a server error), the
number of parts and each part's size (the multipart parser's own limits), and in JSON the
number of items and each string's length (msgspec checks them while decoding). Each image part
is reported as soon as it is complete (``on_image``) so admission can stop reading a body whose
cost no longer fits.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import cache
from typing import Annotated, Any

import msgspec
from multipart import MultipartSegment, ParserError, ParserLimitReached, PushMultipartParser

from gateway.errors import ClientGone, InvalidFields, LimitExceeded, MalformedRequest
from gateway.http.schemas import FORM_OPTIONS, EmbeddingRequest, EncodingFormat
from gateway.pipeline.items import ImageItem

Receive = Callable[[], Any]

#: Multipart fields that are options, not images. Every other part is an image, in order.
OPTION_FIELDS = frozenset(FORM_OPTIONS)


@dataclass(frozen=True)
class ParsedRequest:
    items: list[ImageItem]
    model: str | None
    encoding_format: EncodingFormat | None
    normalize: bool | None
    skip_invalid: bool | None = None


async def body_chunks(receive: Receive, limit: int) -> AsyncIterator[bytes]:
    """The request body from the ASGI channel, at most ``limit`` bytes; ends with ``b""``."""
    received = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone("client disconnected while sending the request body")
        chunk = message.get("body", b"")
        received += len(chunk)
        if received > limit:
            raise LimitExceeded(f"request body over {limit} bytes", limit=limit)
        if chunk:
            yield chunk
        if not message.get("more_body", False):
            yield b""
            return


async def read_all(chunks: AsyncIterator[bytes]) -> bytes:
    body = bytearray()
    async for chunk in chunks:
        body += chunk
    return bytes(body)


#: Characters a base64 string of ``n`` bytes takes, plus room for a ``data:`` URI header.
def _encoded_chars(max_bytes: int) -> int:
    return 4 * -(-max_bytes // 3) + 256


@cache
def _bounded_request(max_items: int, max_chars: int) -> type[EmbeddingRequest]:
    """EmbeddingRequest with its limits in the type: msgspec refuses an over-long list or
    string while decoding, before building it."""
    item = Annotated[str, msgspec.Meta(max_length=max_chars)]
    items = Annotated[list[item], msgspec.Meta(max_length=max_items)]
    fields: list[Any] = [("input", item | items)]
    for field in msgspec.structs.fields(EmbeddingRequest)[1:]:
        fields.append((field.name, field.type, field.default))
    bounded = msgspec.defstruct("EmbeddingRequest", fields, forbid_unknown_fields=False)
    return bounded  # type: ignore[return-value]


_AT_INDEX = re.compile(r"\$\.input\[(\d+)\]")


def parse_json(body: bytes, max_images: int, max_image_bytes: int) -> ParsedRequest:
    max_chars = _encoded_chars(max_image_bytes)
    try:
        request = msgspec.json.decode(body, type=_bounded_request(max_images, max_chars))
    except msgspec.ValidationError as exc:
        message = str(exc)
        if "array` of length <=" in message:
            raise LimitExceeded(
                f"more than {max_images} items in one request; the limit is {max_images}",
                index=max_images,
            ) from exc
        if "str` of length <=" in message:
            found = _AT_INDEX.search(message)
            raise LimitExceeded(
                f"item over {max_image_bytes} bytes ({max_chars} characters of base64)",
                index=int(found.group(1)) if found else 0,
            ) from exc
        raise InvalidFields(f"invalid embeddings request: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise MalformedRequest(f"malformed JSON: {exc}") from exc
    items: list[ImageItem] = [request.input] if isinstance(request.input, str) else [*request.input]
    _check_count(len(items), max_images)
    return ParsedRequest(
        items, request.model, request.encoding_format, request.normalize, request.skip_invalid
    )


async def parse_multipart(
    chunks: AsyncIterator[bytes],
    boundary: str,
    *,
    max_images: int,
    max_image_bytes: int,
    on_image: Callable[[int], None] = lambda _: None,
) -> ParsedRequest:
    """Stream-parse the body, keeping image parts in arrival order whatever their field names."""
    items: list[ImageItem] = []
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
                    if segment.name in OPTION_FIELDS and not segment.filename:
                        options[segment.name] = _text(buffer, segment)
                    else:
                        on_image(len(buffer))  # may refuse: the rest is never read
                        items.append(bytes(buffer))
            if not chunk:
                break
        parser.close()
    except ParserLimitReached as exc:
        raise LimitExceeded(
            f"multipart limit reached at part {len(items)}: {exc} (at most {max_images} images "
            f"of at most {max_image_bytes} bytes each)",
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
        return buffer.decode(charset).strip()
    except (LookupError, UnicodeDecodeError) as exc:
        raise MalformedRequest(f"form field {segment.name!r} is not valid {charset}") from exc


def _check_count(count: int, max_images: int) -> None:
    if count == 0:
        raise MalformedRequest("no images in the request")
    if count > max_images:
        raise LimitExceeded(
            f"{count} images in one request; the limit is {max_images}", index=max_images
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
