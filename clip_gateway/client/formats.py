"""What a file is, told by its first bytes (never its name: clip_gateway/imaging/formats.py, shared
with the server), and opening it with Pillow.

The gateway decodes JPEG, PNG, WebP and GIF itself and takes the first three as they are; the
formats phones and the web add (HEIC/HEIF, AVIF, GIF) are opened here and converted on the client
(compact.py). HEIF comes from pillow-heif (a base dependency); AVIF from Pillow's own plugin,
present in Pillow's wheels (a Pillow built without libavif, such as pillow-simd, reports AVIF files
as unreadable).
"""

from __future__ import annotations

import io
from functools import cache

from PIL import Image, UnidentifiedImageError, features

# the signatures the server reads too (re-exported: the client's modules ask ``formats`` for both)
from clip_gateway.imaging.formats import HEAD_BYTES as HEAD_BYTES
from clip_gateway.imaging.formats import identify as identify

#: Formats the gateway accepts as they are.
GATEWAY_FORMATS = frozenset({"jpeg", "png", "webp"})
#: Every format the client reads (the others are converted to JPEG before upload).
READABLE = GATEWAY_FORMATS | {"gif", "heif", "avif"}
#: Extensions of the formats above: a file so named is reported when its content is no image.
EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".jpe", ".png", ".webp", ".gif", ".heic", ".heif", ".hif", ".avif"}
)


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
    except UnidentifiedImageError as exc:  # its message names a BytesIO object, not the file
        raise UnreadableImage(f"damaged or not a {kind.upper()} file") from exc
    except Exception as exc:  # Pillow and its plugins raise many kinds for bad files
        raise UnreadableImage(f"corrupt or truncated {kind.upper()}: {exc}") from exc
    return image
