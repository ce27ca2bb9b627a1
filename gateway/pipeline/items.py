"""Request items as the pipeline sees them: an image as raw bytes or base64 text."""

from __future__ import annotations

import base64
import binascii

from gateway.errors import InvalidImage

#: An image as raw bytes (multipart) or as base64 / a ``data:`` URI (JSON).
ImageItem = bytes | str


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
