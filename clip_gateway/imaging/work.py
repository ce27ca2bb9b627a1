"""What decoding an image will cost, read from its header before anything is decoded.

Encoded bytes say little about decode work: a lossless WebP of a flat 30 MP canvas is a few
hundred bytes and costs ~0.3 CPU-seconds, an arithmetic-coded 100 MP JPEG is 211 bytes. The price
here is the source pixels the decoder walks times a per-format, per-coding factor, plus the
encoded bytes times a per-coding factor (entropy decoding scales with the bits, which is where a
camera photo's time goes). The factors are CPU seconds on one core of the 2-CPU development
machine (Pillow 11 / libjpeg-turbo via simplejpeg, decode + resize to 224 px, best of 3;
docs/ADMISSION.md has the table); admission learns, per format, how far this machine is from
them (pipeline/admission.py).

JPEGs are decoded at the DCT scale that keeps the target size, so the resize of a JPEG is over
few pixels: its pixel factor is its entropy decode's, per 8x8-block row of the source.
Arithmetic-coded JPEGs are decoded (libjpeg-turbo supports them) and priced at their measured
cost: ~15x a Huffman JPEG's per encoded byte.
"""

from __future__ import annotations

from dataclasses import dataclass

from clip_gateway.imaging import containers, jpeg

#: CPU seconds per source pixel and per encoded byte, by format and coding (measured, see above).
#: PNG's 16-bit and interlaced factors are the 8-bit one scaled by the work they add (twice the
#: bytes to unfilter; seven passes): priors that the learned per-format rate corrects.
FACTORS: dict[str, tuple[float, float]] = {
    "jpeg-baseline": (0.3e-9, 8e-9),
    "jpeg-progressive": (1.5e-9, 8e-9),
    "jpeg-arithmetic": (0.3e-9, 130e-9),
    "png": (4.5e-9, 10e-9),
    "png-16bit": (9e-9, 10e-9),
    "png-interlaced": (6e-9, 10e-9),
    "webp-lossy": (9e-9, 60e-9),
    "webp-lossless": (9e-9, 8e-9),
    "gif": (5e-9, 4e-9),
}
#: A base64 item is decoded this far to read its header (a JPEG's frame header follows its
#: APP segments: EXIF and ICC profiles, rarely over a few hundred KB).
HEADER_PREFIX = 1 << 20


@dataclass(frozen=True)
class Work:
    """One image's decode price: ``format`` (``jpeg``, ``png``, ``webp``, ``gif``, or ``other``
    for anything the decoder will refuse in a few microseconds), its coding, and the CPU
    seconds it costs at the factors above."""

    format: str
    coding: str
    seconds: float


#: An image the decoder refuses from its first bytes (unknown or unsupported format, unreadable
#: header): priced at nothing beyond the per-item overhead.
REFUSED = Work("other", "refused", 0.0)


#: Pixels assumed for an image whose header lies beyond the prefix read (the default pixel limit).
WORST_PIXELS = 100_000_000


def worst(data: bytes, encoded_bytes: int) -> Work:
    """The price of an item whose header was not within its first ``HEADER_PREFIX`` bytes: a
    real file never puts that much before its frame, so it is priced at the pixel limit in the
    dearest coding of its format (or as refused, when no accepted format's signature starts
    it)."""
    if data.startswith(b"\xff\xd8\xff"):
        return price("jpeg-progressive", WORST_PIXELS, encoded_bytes)
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return price("png-16bit", WORST_PIXELS, encoded_bytes)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return price("webp-lossy", WORST_PIXELS, encoded_bytes)
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return price("gif", WORST_PIXELS, encoded_bytes)
    return REFUSED


def jpeg_coding(progressive: bool, arithmetic: bool) -> str:
    if arithmetic:
        return "jpeg-arithmetic"
    return "jpeg-progressive" if progressive else "jpeg-baseline"


def price(coding: str, pixels: int, encoded_bytes: int) -> Work:
    per_pixel, per_byte = FACTORS[coding]
    return Work(coding.split("-")[0], coding, per_pixel * pixels + per_byte * encoded_bytes)


def estimate(data: bytes, encoded_bytes: int | None = None) -> Work:
    """The price of ``data`` (or of its first bytes, with the whole item ``encoded_bytes``
    long), from the same header readers the decoder trusts."""
    size = len(data) if encoded_bytes is None else encoded_bytes
    try:
        coding, pixels = header(data)
    except (ValueError, IndexError):
        return REFUSED  # the decoder refuses it before any work
    return price(coding, pixels, size)


def header(data: bytes) -> tuple[str, int]:
    """(coding, source pixels) from the header; ValueError when there is none to read."""
    if data.startswith(b"\xff\xd8\xff"):
        frame = jpeg.frame(data)
        return jpeg_coding(frame.progressive, frame.arithmetic), frame.width * frame.height
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        info = containers.png_header(data)
        return info.coding, info.width * info.height
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        info = containers.webp(data)
        return info.coding, info.width * info.height
    if data[:6] in (b"GIF87a", b"GIF89a"):
        info = containers.gif(data)
        return "gif", info.width * info.height
    raise ValueError("not an accepted image format")
