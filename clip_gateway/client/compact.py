"""Compact upload: shrink a photo on the client before it travels (the reports' main lesson).

JPEGs are decoded at a power-of-two DCT scale (progressive ones from their DC scans only, as
the gateway does: imaging/jpeg.py), turned upright by their EXIF orientation (re-encoding drops
EXIF; imaging/orientation.py, the gateway's own reader), resized so the short side is 256 px
(for a 224-px model; 8/7 of the model's input size in general, the long side for models that
fit the whole image, from ``GET /v1/models``: ``CompactOptions.for_model``) and re-encoded at
quality 85. Measured against
sending the original 8-24 MP photo to the same gateway: cosine >= 0.9997, 10 KB instead of
4.4 MB (README, "Client"). Small images are sent as they are.

Formats the gateway does not decode (HEIC/HEIF, AVIF, GIF: formats.py) are always converted to
a JPEG here, shrunk like the others (at their own size when shrinking is off); a file that
cannot be read raises ``UnreadableImage``.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import simplejpeg
from PIL import Image

from clip_gateway.client import formats
from clip_gateway.imaging import jpeg, orientation

ImageLike = str | Path | bytes | Image.Image


@dataclass(frozen=True)
class CompactOptions:
    enabled: bool = True
    #: The side kept at this many pixels: the short one, or the long one with ``long_side``.
    short_side: int = 256
    quality: int = 85
    #: Images whose short side is at most this, and JPEGs, are sent untouched when below
    #: ``keep_bytes``: shrinking them would save nothing worth a re-encode.
    keep_bytes: int = 48_000
    #: Keep the long side at ``short_side`` (a model that resizes the long side and pads).
    long_side: bool = False

    def for_model(self, card: dict[str, Any]) -> CompactOptions:
        """These options with the size the served model needs (a ``/v1/models`` entry): 8/7 of
        its input size on the side its resize reads (224 px -> 256, 384 -> 439), so the
        gateway still resizes down, never up."""
        size = int(card.get("image_size") or 224)
        mode = (card.get("preprocessing") or {}).get("resize_mode", "shortest")
        side = max(self.short_side, math.ceil(size * 8 / 7))
        return replace(self, short_side=side, long_side=mode == "longest")


def read(image: ImageLike) -> bytes | Image.Image:
    if isinstance(image, str | Path):
        return Path(image).read_bytes()
    return image


def compact(image: ImageLike, options: CompactOptions | None = None) -> bytes:
    """Bytes to upload for ``image``: a small JPEG, or the original when that is best."""
    options = options or CompactOptions()
    source = read(image)
    if isinstance(source, Image.Image):
        turn = int(source.getexif().get(orientation.TAG, 1))  # parsed by Pillow already
        return _encode(_shrink(upright(source.convert("RGB"), turn), options), options)
    kind = formats.identify(source[: formats.HEAD_BYTES])
    if kind is not None and kind not in formats.GATEWAY_FORMATS:
        return _convert(source, kind, options)
    if not options.enabled:
        return source
    if kind == "jpeg":
        return _compact_jpeg(source, options)
    return _compact_other(source, options)


def _convert(data: bytes, kind: str, options: CompactOptions) -> bytes:
    """A JPEG the gateway accepts, from a format it does not (the first frame of a GIF)."""
    with formats.open_image(data, kind) as opened:
        # pillow-heif has already applied HEIF's own rotation and reset the EXIF tag to 1.
        turn = int(opened.getexif().get(orientation.TAG, 1))
        image = upright(opened.convert("RGB"), turn)
    return _encode(_shrink(image, options) if options.enabled else image, options)


def _compact_jpeg(data: bytes, options: CompactOptions) -> bytes:
    try:
        header = jpeg.read_header(data)
    except jpeg.JpegError:
        return data  # the gateway will say what is wrong with it
    if len(data) <= options.keep_bytes or header.colorspace in ("CMYK", "YCCK"):
        return data
    try:
        rgb = jpeg.decode_scaled(data, header, options.short_side, max_scans=1000, dc_only=True,
                                 long_side=options.long_side)  # fmt: skip
    except jpeg.JpegError:
        return data
    rgb = orientation.upright(rgb, orientation.of(data))
    return _encode(_shrink(Image.fromarray(np.ascontiguousarray(rgb)), options), options)


def _compact_other(data: bytes, options: CompactOptions) -> bytes:
    if len(data) <= options.keep_bytes:
        return data
    turn = orientation.of(data)
    try:
        with Image.open(io.BytesIO(data)) as opened:
            image = upright(opened.convert("RGB"), turn)
    except Exception:  # not something we can shrink: let the gateway judge it
        return data
    return _encode(_shrink(image, options), options)


def upright(image: Image.Image, turn: int) -> Image.Image:
    """``image`` as it should be seen, for EXIF orientation ``turn``."""
    if turn == 1:
        return image
    return Image.fromarray(np.ascontiguousarray(orientation.upright(np.asarray(image), turn)))


def _shrink(image: Image.Image, options: CompactOptions) -> Image.Image:
    width, height = image.size
    scale = options.short_side / (max(width, height) if options.long_side else min(width, height))
    if scale >= 1:
        return image
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    return image.resize(size, Image.Resampling.BICUBIC)


def _encode(image: Image.Image, options: CompactOptions) -> bytes:
    pixels = np.ascontiguousarray(np.asarray(image.convert("RGB")))
    return bytes(simplejpeg.encode_jpeg(pixels, quality=options.quality, colorsubsampling="420"))
