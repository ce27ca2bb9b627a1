"""What a file is, told by its first bytes (never its name), and opening it with Pillow.

The gateway decodes JPEG, PNG and WebP itself; the formats phones and the web add (HEIC/HEIF,
AVIF, GIF) are opened here and converted on the client (compact.py). HEIF comes from
pillow-heif (a base dependency); AVIF from Pillow's own plugin, present in Pillow's wheels
(a Pillow built without libavif, such as pillow-simd, reports AVIF files as unreadable).
"""

from __future__ import annotations

import io
from functools import cache

from PIL import Image, features

#: Formats the gateway accepts as they are.
GATEWAY_FORMATS = frozenset({"jpeg", "png", "webp"})
#: Every format the client reads (the others are converted to JPEG before upload).
READABLE = GATEWAY_FORMATS | {"gif", "heif", "avif"}
#: Bytes of a file's start that ``identify`` needs.
HEAD_BYTES = 64
#: Extensions of the formats above: a file so named is reported when its content is no image.
EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".jpe", ".png", ".webp", ".gif", ".heic", ".heif", ".hif", ".avif"}
)

_AVIF_BRANDS = {b"avif", b"avis"}
_HEIF_BRANDS = {b"heic", b"heix", b"hevc", b"hevx", b"heim", b"heis", b"mif1", b"msf1"}


def identify(head: bytes) -> str | None:
    """``jpeg``, ``png``, ``webp``, ``gif``, ``heif`` or ``avif`` from a file's first bytes."""
    if head.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if head[4:8] == b"ftyp":
        return _iso_brand(head)
    return None


def _iso_brand(head: bytes) -> str | None:
    """AVIF or HEIF from the ``ftyp`` box: the major brand, then the compatible ones
    (``mif1`` alone says "an image file", not which codec)."""
    size = int.from_bytes(head[:4], "big")
    brands = [head[8:12]] + [head[i : i + 4] for i in range(16, min(size, len(head)) - 3, 4)]
    if any(brand in _AVIF_BRANDS for brand in brands):
        return "avif"
    if any(brand in _HEIF_BRANDS for brand in brands):
        return "heif"
    return None


@cache
def _register_heif() -> None:
    from pillow_heif import register_heif_opener

    register_heif_opener()


class UnreadableImage(ValueError):
    """A file the client cannot turn into pixels; the message says why."""


def plugins_for(kind: str | None) -> None:
    """Make Pillow able to open ``kind`` (HEIF needs pillow-heif's opener, registered once)."""
    if kind == "heif":
        _register_heif()


def open_image(data: bytes, kind: str) -> Image.Image:
    """``data`` decoded by Pillow as ``kind`` (the first frame of an animation), loaded."""
    plugins_for(kind)
    if kind == "avif" and not features.check("avif"):
        raise UnreadableImage("this Pillow has no AVIF support (stock Pillow wheels have it)")
    try:
        image = Image.open(io.BytesIO(data))
        image.load()
    except Image.DecompressionBombError as exc:
        raise UnreadableImage(f"too large to decode: {exc}") from exc
    except Exception as exc:  # Pillow and its plugins raise many kinds for bad files
        raise UnreadableImage(f"corrupt or truncated {kind.upper()}: {exc}") from exc
    return image
