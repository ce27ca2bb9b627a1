"""Request items as the pipeline sees them, typed by the parser that read them: an image (its
raw bytes, the base64 text JSON carried, decoded in the pool, or the bytes fetched from its
URL), or a text."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from clip_gateway.errors import EmbeddingError, InvalidImage
from clip_gateway.imaging import work


@dataclass(frozen=True, slots=True)
class ImageItem:
    """An image: its raw bytes (multipart), or base64 text, ``b64`` (JSON: plain base64 or a
    ``data:`` URI), decoded strictly where the image is decoded, in the pool."""

    data: bytes = b""
    b64: str | None = None
    #: Where a URL item came from (http/urls/fetch.py fetches it into ``data`` before the pipeline
    #: sees it); ``error``: why it could not be, reported for its index (``skip_invalid``).
    url: str | None = None
    error: EmbeddingError | None = None

    @classmethod
    def from_base64(cls, text: str) -> ImageItem:
        """An image as base64 text or a ``data:`` URI."""
        return cls(b64=text)


@dataclass(frozen=True, slots=True)
class TextItem:
    """A text to embed into the image space (a search query, a caption)."""

    text: str


#: One item of a request: images and texts may be mixed, answered in request order.
Item = ImageItem | TextItem


#: What to send instead, said in every base64 refusal.
_SEND = "send standard base64 (RFC 4648 section 4: A-Z a-z 0-9 + /, = padding)"


def is_data_uri(text: str) -> bool:
    """RFC 2397: the scheme and the media type are case-insensitive."""
    return text[:5].lower() == "data:"


def item_bytes(item: ImageItem) -> bytes:
    """Raw bytes of an item; base64 and ``data:`` URIs are decoded strictly, except that line
    breaks and spaces (MIME-wrapped base64, RFC 2045) are allowed. A URL item that could not be
    fetched raises why."""
    if item.error is not None:
        raise item.error
    if item.b64 is None:
        return item.data
    text = item.b64
    if is_data_uri(text):
        header, sep, text = text.partition(",")
        if not sep or not header.lower().endswith(";base64"):
            raise InvalidImage("data: URI must be base64-encoded (data:image/jpeg;base64,...)")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        return _lenient(text, exc)


def _lenient(text: str, exc: Exception) -> bytes:
    """The second chance of a string strict base64 refused: without its whitespace; or a
    refusal that says what was wrong and what to send."""
    if "-" in text or "_" in text:
        raise InvalidImage(f"base64 with - or _ (the URL-safe alphabet) is not accepted; {_SEND}")
    compact = "".join(text.split())
    if compact != text:
        try:
            return base64.b64decode(compact, validate=True)
        except (binascii.Error, ValueError) as again:
            exc = again
    raise InvalidImage(f"invalid base64: {exc}; {_SEND}") from None


def price(item: ImageItem, plan: work.Plan = work.DEFAULT_PLAN) -> work.Work:
    """The decode price of an image item under ``plan``, from its header (imaging/work.py):
    raw bytes as they are, base64 from its first ``work.HEADER_PREFIX`` bytes once decoded. An
    item whose header cannot be read, or breaks the decoder's budget, is priced as refused: the
    decoder refuses it before any work."""
    if item.error is not None:
        return work.REFUSED
    if item.b64 is None:
        return work.estimate(item.data, plan=plan)
    text = item.b64
    if is_data_uri(text):
        text = text.partition(",")[2]
    chars = 4 * -(-work.HEADER_PREFIX // 3)
    prefix = "".join(text[: chars + chars // 16].split())[:chars]  # line breaks allowed
    prefix = prefix[: len(prefix) // 4 * 4]
    try:
        head = base64.b64decode(prefix, validate=True)
    except (binascii.Error, ValueError):
        return work.REFUSED
    size = len(text) * 3 // 4
    priced = work.estimate(head, size, plan)
    if priced is work.REFUSED and len(head) >= work.HEADER_PREFIX:
        return work.worst(head, size, plan)  # its header is further in than any real file's
    return priced
