"""Request items as the pipeline sees them: an image as raw bytes or base64 text, or a text."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from gateway.errors import InvalidImage
from gateway.imaging import work

#: An image as raw bytes (multipart) or as base64 / a ``data:`` URI (JSON).
ImageItem = bytes | str


@dataclass(frozen=True, slots=True)
class TextItem:
    """A text to embed into the image space (a search query, a caption)."""

    text: str


#: One item of a request: images and texts may be mixed, answered in request order.
Item = ImageItem | TextItem


def item_bytes(item: ImageItem) -> bytes:
    """Raw bytes of an item; base64 and ``data:`` URIs are decoded strictly."""
    if isinstance(item, bytes):
        return item
    text = item
    if text.startswith("data:"):
        header, sep, text = text.partition(",")
        if not sep or not header.endswith(";base64"):
            raise InvalidImage("data: URI must be base64-encoded (data:image/jpeg;base64,...)")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidImage(f"invalid base64: {exc}") from exc


def price(item: ImageItem) -> work.Work:
    """The decode price of an image item, from its header (imaging/work.py): raw bytes as they
    are, base64 from its first ``work.HEADER_PREFIX`` bytes once decoded. An item whose header
    cannot be read is priced as refused: the decoder refuses it before any work."""
    if isinstance(item, bytes):
        return work.estimate(item)
    text = item
    if text[:5].lower() == "data:":
        text = text.partition(",")[2]
    chars = 4 * -(-work.HEADER_PREFIX // 3)
    prefix = "".join(text[: chars + chars // 16].split())[:chars]  # line breaks allowed
    prefix = prefix[: len(prefix) // 4 * 4]
    try:
        head = base64.b64decode(prefix, validate=True)
    except (binascii.Error, ValueError):
        return work.REFUSED
    return work.estimate(head, len(text) * 3 // 4)
