"""Request items as the pipeline sees them: an image as raw bytes or base64 text, or a text."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from gateway.errors import InvalidImage

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
