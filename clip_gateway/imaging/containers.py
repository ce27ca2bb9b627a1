"""What a PNG, WebP or GIF header promises, read from the bytes before any decoder sees them.

Each reader walks the container's chunk list with every offset checked and the number of steps
capped, so the smallest hostile input costs a few thousand cheap steps at most. The answer
(dimensions, channels, where the EXIF block is) is what the decode budget is computed from
(imaging/preprocess.py): a decoder that would need more memory than the budget never starts.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

#: Chunks a PNG may have: at least this many, or one per KiB of file (Pillow reads each chunk in
#: Python, so their number, not their size, is what costs). Real encoders write 8-64 KiB chunks.
MIN_PNG_CHUNKS = 8192
MAX_WEBP_CHUNKS = 64


class ContainerError(ValueError):
    """The header is malformed, cut short, or breaks a structural limit."""


@dataclass(frozen=True)
class ContainerInfo:
    width: int
    height: int
    #: Peak decoder memory per pixel: Pillow's full-size buffer, libwebp's own, and the RGB
    #: copy when the mode is not RGB (measured: tests/unit/imaging/test_preprocess_memory.py).
    bytes_per_pixel: int
    #: Where the EXIF (TIFF) block is, ``data[start:end]``, if there is one.
    exif: tuple[int, int] | None = None
    #: The coding admission prices (imaging/work.py): ``png``, ``png-16bit``,
    #: ``png-interlaced``, ``webp-lossy``, ``webp-lossless``, ``gif``.
    coding: str = ""


_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # colour type -> samples per pixel
#: Peak bytes per pixel by colour type: Pillow keeps RGB as RGBX (4, no conversion needed);
#: RGBA and LA (4) are converted to RGB (4 more); L and P (1) likewise (4 more).
_PNG_PEAK = {0: 5, 2: 4, 3: 5, 4: 8, 6: 8}
#: 16-bit grey becomes Pillow's I;16 (2 bytes), then RGB.
_PNG_GREY16_PEAK = 6
#: libwebp decodes into its own RGBA buffer, Pillow copies it into a bytes object and then into
#: its image (4 bytes each), and the conversion to RGB adds 4: 16 bytes per pixel, measured for
#: lossy and lossless, with and without alpha.
WEBP_PEAK = 16
#: The palette image (1 byte) and its RGB copy (4).
GIF_PEAK = 5


def png_header(data: bytes) -> ContainerInfo:
    """IHDR alone: dimensions, samples and coding (what admission prices)."""
    if len(data) < 33 or data[12:16] != b"IHDR":
        raise ContainerError("PNG without an IHDR chunk")
    width, height, depth, colour, _compression, _filter, interlace = struct.unpack_from(
        ">IIBBBBB", data, 16
    )
    if colour not in _PNG_CHANNELS or depth not in (1, 2, 4, 8, 16):
        raise ContainerError(f"PNG with colour type {colour} and bit depth {depth}")
    coding = "png-interlaced" if interlace else "png-16bit" if depth == 16 else "png"
    # Pillow unpacks 16-bit colour samples to 8 bits row by row (its buffer holds 8-bit samples)
    peak = _PNG_GREY16_PEAK if (colour, depth) == (0, 16) else _PNG_PEAK[colour]
    return ContainerInfo(width, height, peak, None, coding)


def png(data: bytes) -> ContainerInfo:
    """IHDR's dimensions, and a walk of every chunk to IEND (capped) to find eXIf."""
    head = png_header(data)
    limit = max(MIN_PNG_CHUNKS, len(data) // 1024)
    pos, end, exif = 8, len(data), None
    for _ in range(limit):
        if pos + 8 > end:
            break  # cut short: Pillow reports it when it decodes
        length = int.from_bytes(data[pos : pos + 4], "big")
        kind = data[pos + 4 : pos + 8]
        if kind == b"eXIf" and exif is None:
            exif = (pos + 8, min(pos + 8 + length, end))
        if kind == b"IEND":
            break
        pos += 12 + length
    else:
        raise ContainerError(f"PNG has more than {limit} chunks")
    return ContainerInfo(head.width, head.height, head.bytes_per_pixel, exif, head.coding)


def webp(data: bytes) -> ContainerInfo:
    """The canvas from VP8X (or the VP8/VP8L frame header), and the EXIF chunk."""
    end = min(len(data), 8 + int.from_bytes(data[4:8], "little"))
    pos, size, exif, lossless = 12, None, None, False
    for _ in range(MAX_WEBP_CHUNKS):
        if pos + 8 > end:
            break
        fourcc = data[pos : pos + 4]
        length = int.from_bytes(data[pos + 4 : pos + 8], "little")
        body = pos + 8
        lossless |= fourcc == b"VP8L"  # alone, or a frame of an animation (ANMF: not seen)
        if fourcc == b"VP8X" and length >= 10 and body + 10 <= end:
            size = (
                1 + int.from_bytes(data[body + 4 : body + 7], "little"),
                1 + int.from_bytes(data[body + 7 : body + 10], "little"),
            )
        elif fourcc == b"VP8L" and size is None and body + 5 <= end:
            bits = int.from_bytes(data[body + 1 : body + 5], "little")
            size = (1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF))
        elif fourcc == b"VP8 " and size is None and body + 10 <= end:
            size = (
                int.from_bytes(data[body + 6 : body + 8], "little") & 0x3FFF,
                int.from_bytes(data[body + 8 : body + 10], "little") & 0x3FFF,
            )
        elif fourcc == b"EXIF" and exif is None:
            exif = (body, min(body + length, end))
        pos = body + length + (length & 1)  # chunks are padded to an even length
    if size is None or 0 in size:
        raise ContainerError("WebP without a readable frame size")
    coding = "webp-lossless" if lossless else "webp-lossy"
    return ContainerInfo(size[0], size[1], WEBP_PEAK, exif, coding)


def gif(data: bytes) -> ContainerInfo:
    """The logical screen: Pillow decodes the first frame onto a canvas that size."""
    if len(data) < 13:
        raise ContainerError("GIF header cut short")
    width, height = struct.unpack_from("<HH", data, 6)
    if not width or not height:
        raise ContainerError("GIF with an empty logical screen")
    return ContainerInfo(width, height, GIF_PEAK, None, "gif")
