"""Request bodies to image items: multipart parts in order, or the OpenAI JSON shape."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import msgspec
from multipart import MultipartSegment, ParserError, ParserLimitReached, PushMultipartParser

from gateway.errors import InvalidFields, LimitExceeded, MalformedRequest
from gateway.http.schemas import FORM_OPTIONS, EmbeddingRequest, EncodingFormat
from gateway.pipeline.items import ImageItem

#: Multipart fields that are options, not images. Every other part is an image, in order.
OPTION_FIELDS = frozenset(FORM_OPTIONS)


@dataclass(frozen=True)
class ParsedRequest:
    items: list[ImageItem]
    model: str | None
    encoding_format: EncodingFormat | None
    normalize: bool | None
    skip_invalid: bool | None = None


def parse_json(body: bytes, max_images: int) -> ParsedRequest:
    try:
        request = msgspec.json.decode(body, type=EmbeddingRequest)
    except msgspec.ValidationError as exc:
        raise InvalidFields(f"invalid embeddings request: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise MalformedRequest(f"malformed JSON: {exc}") from exc
    items: list[ImageItem] = [request.input] if isinstance(request.input, str) else [*request.input]
    _check_count(len(items), max_images)
    return ParsedRequest(
        items, request.model, request.encoding_format, request.normalize, request.skip_invalid
    )


async def parse_multipart(
    chunks: AsyncIterator[bytes], boundary: str, *, max_images: int, max_image_bytes: int
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
                        options[segment.name] = buffer.decode(segment.charset or "utf-8").strip()
                    else:
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
