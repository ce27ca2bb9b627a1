"""One image's bytes to uint8 ``[S, S, 3]``: sniff, decode small, resize, centre-crop.

Mirrors open_clip's pipeline (bicubic antialiased resize of the short side, centre crop) but never
decodes a large JPEG at full size (imaging/jpeg.py), crops before it resamples (the resize reads
only the centre square), and applies EXIF orientation to the 224x224 result, where it is a cheap
array view: a centred square crop commutes with rotations and flips.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from PIL import Image

from gateway.errors import ImageTooLarge, InvalidImage, LimitExceeded, UnsupportedFormat
from gateway.imaging import jpeg, orientation

#: Formats recognised by signature but not accepted (415 rather than "not an image").
_UNSUPPORTED_SIGNATURES: tuple[tuple[bytes, int, str], ...] = (
    (b"GIF87a", 0, "gif"),
    (b"GIF89a", 0, "gif"),
    (b"BM", 0, "bmp"),
    (b"II*\x00", 0, "tiff"),
    (b"MM\x00*", 0, "tiff"),
    (b"8BPS", 0, "psd"),
    (b"\x00\x00\x01\x00", 0, "ico"),
    (b"\x00\x00\x00\x0cjP  ", 0, "jpeg2000"),
    (b"\xff\x4f\xff\x51", 0, "jpeg2000"),
    (b"\xff\x0a", 0, "jpeg-xl"),
    (b"\x00\x00\x00\x0cJXL ", 0, "jpeg-xl"),
    (b"%PDF", 0, "pdf"),
)
_HEIF_BRANDS = {b"heic", b"heix", b"hevc", b"heim", b"heis", b"mif1", b"msf1", b"avif", b"avis"}


@dataclass(frozen=True)
class ImageOptions:
    size: int
    max_pixels: int
    max_bytes: int
    #: Progressive JPEGs with more scans than this are refused (CPU bombs).
    max_scans: int = 256
    progressive_dc_only: bool = True


@dataclass(frozen=True)
class Decoded:
    """What was decoded, for spans and metrics."""

    format: str
    width: int
    height: int
    decoded_pixels: int
    encoded_bytes: int


def sniff(data: bytes) -> str:
    """``jpeg`` / ``png`` / ``webp``, or raise 415 (known, unsupported) / 422 (not an image)."""
    if data.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    for signature, offset, name in _UNSUPPORTED_SIGNATURES:
        if data[offset : offset + len(signature)] == signature:
            raise UnsupportedFormat(f"{name} images are not supported; send JPEG, PNG or WebP")
    if data[4:8] == b"ftyp" and data[8:12] in _HEIF_BRANDS:
        raise UnsupportedFormat("HEIF/AVIF images are not supported; send JPEG, PNG or WebP")
    raise InvalidImage("not an image: no JPEG, PNG or WebP signature in the first bytes")


def preprocess(data: bytes, out: np.ndarray, options: ImageOptions) -> Decoded:
    """Decode ``data`` and write the model's input into ``out`` (``[S, S, 3]`` uint8)."""
    if not data:
        raise InvalidImage("empty image (0 bytes)")
    if len(data) > options.max_bytes:
        raise LimitExceeded(
            f"image is {len(data)} bytes; the limit is {options.max_bytes}",
            limit=options.max_bytes,
        )
    kind = sniff(data)
    rgb, info = _decode_jpeg(data, options) if kind == "jpeg" else (None, None)
    if rgb is None or info is None:
        rgb, info = _decode_with_pillow(data, kind, options)
    turn = _ORIENTATION_OF[kind](data)
    out[...] = orientation.upright(_resize_centre(rgb, options.size), turn)
    return info


def _check_pixels(width: int, height: int, options: ImageOptions) -> None:
    if width * height > options.max_pixels:
        raise ImageTooLarge(
            f"image is {width}x{height} ({width * height} pixels); the limit is "
            f"{options.max_pixels} pixels",
            limit=options.max_pixels,
        )


def _decode_jpeg(data: bytes, options: ImageOptions) -> tuple[np.ndarray | None, Decoded | None]:
    try:
        header = jpeg.read_header(data)
    except jpeg.JpegError as exc:
        raise InvalidImage(str(exc)) from exc
    _check_pixels(header.width, header.height, options)
    if header.colorspace in ("CMYK", "YCCK"):
        return None, None  # libjpeg-turbo cannot output RGB from these; Pillow can
    try:
        rgb = jpeg.decode_scaled(
            data,
            header,
            options.size,
            max_scans=options.max_scans,
            dc_only=options.progressive_dc_only,
        )
    except jpeg.JpegError as exc:
        raise InvalidImage(str(exc)) from exc
    info = Decoded("jpeg", header.width, header.height, rgb.shape[0] * rgb.shape[1], len(data))
    return rgb, info


#: EXIF orientation of each accepted format, by our bounded reader (never Pillow's IFD loader).
_ORIENTATION_OF: dict[str, Callable[[bytes], int]] = {
    "jpeg": orientation.from_jpeg,
    "png": orientation.from_png,
    "webp": orientation.from_webp,
}


def _decode_with_pillow(
    data: bytes, kind: str, options: ImageOptions
) -> tuple[np.ndarray, Decoded]:
    try:
        image = Image.open(io.BytesIO(data), formats=[kind.upper()])
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        # Pillow's own bomb check (a warning, or an error under -W error) also runs on the header.
        raise ImageTooLarge(str(exc)) from exc
    except Exception as exc:  # Pillow raises many types for hostile headers
        raise InvalidImage(f"cannot read {kind} header: {exc}") from exc
    with image:
        width, height = image.size
        _check_pixels(width, height, options)
        if kind == "jpeg":  # CMYK/YCCK: let libjpeg scale in the DCT domain here too
            image.draft("RGB", (options.size, options.size))
        try:
            image.load()
            rgb = np.asarray(image.convert("RGB"))
        except MemoryError:
            raise
        except Exception as exc:
            raise InvalidImage(f"corrupt or truncated {kind} image: {exc}") from exc
    decoded = Decoded(kind, width, height, rgb.shape[0] * rgb.shape[1], len(data))
    return rgb, decoded


def _resize_centre(rgb: np.ndarray, size: int) -> np.ndarray:
    """Bicubic, antialiased resize of the centre square to ``size`` x ``size``."""
    height, width = rgb.shape[:2]
    side = min(width, height)
    left, top = (width - side) / 2, (height - side) / 2
    image = Image.fromarray(rgb)
    if side == size and left.is_integer() and top.is_integer():
        square = image.crop((int(left), int(top), int(left) + size, int(top) + size))
    else:
        # reducing_gap: a box pre-reduction for PNG/WebP, which have no DCT scaling.
        square = image.resize(
            (size, size),
            Image.Resampling.BICUBIC,
            box=(left, top, left + side, top + side),
            reducing_gap=3.0 if side > 3 * size else None,
        )
    return np.asarray(square)
