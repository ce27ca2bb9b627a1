"""EXIF orientation (tag 0x0112): found in JPEG, PNG and WebP, read, and applied. One
implementation for the gateway and the client.

Untrusted bytes never reach a general EXIF loader: Pillow's reads every IFD and can be made to
allocate the same bytes thousands of times. Here only IFD0 is walked, for one tag, with every
offset checked against the buffer and the number of entries and container chunks capped, so
the cost of any input is a few hundred small steps at most.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import numpy as np

TAG = 0x0112
#: IFD entries looked at (real files have 10-60 in IFD0).
MAX_ENTRIES = 512
#: Container chunks walked while looking for the EXIF block.
MAX_CHUNKS = 4096
_SHORT = 3
_EXIF_HEADER = b"Exif\x00\x00"


def from_tiff(data: bytes, start: int = 0, end: int | None = None) -> int:
    """The orientation in the TIFF-structured EXIF block ``data[start:end]`` (an ``Exif\\0\\0``
    prefix is allowed); 1 when absent, out of range or malformed: a bad EXIF block never fails
    an image. Reads in place: the block is never copied."""
    end = len(data) if end is None else min(end, len(data))
    if data[start : start + 6] == _EXIF_HEADER:
        start += 6
    if end - start < 8:
        return 1
    order = {b"II": "<", b"MM": ">"}.get(data[start : start + 2])
    if order is None or struct.unpack_from(order + "H", data, start + 2)[0] != 42:
        return 1
    ifd = start + struct.unpack_from(order + "I", data, start + 4)[0]
    if ifd + 2 > end:
        return 1
    entries = min(struct.unpack_from(order + "H", data, ifd)[0], MAX_ENTRIES, (end - ifd - 2) // 12)
    for i in range(entries):
        at = ifd + 2 + 12 * i
        tag, kind, count = struct.unpack_from(order + "HHI", data, at)
        if tag == TAG:
            if kind != _SHORT or count != 1:
                return 1
            value = int(struct.unpack_from(order + "H", data, at + 8)[0])
            return value if 1 <= value <= 8 else 1
    return 1


def from_png(data: bytes) -> int:
    """From the ``eXIf`` chunk, before or after the image data."""
    pos, end = 8, len(data)
    for _ in range(MAX_CHUNKS):
        if pos + 8 > end:
            return 1
        length = int.from_bytes(data[pos : pos + 4], "big")
        kind = data[pos + 4 : pos + 8]
        if kind == b"eXIf":
            return from_tiff(data, pos + 8, pos + 8 + length)
        if kind == b"IEND":
            return 1
        pos += 12 + length
    return 1


def from_webp(data: bytes) -> int:
    """From the RIFF ``EXIF`` chunk."""
    pos, end = 12, min(len(data), 8 + int.from_bytes(data[4:8], "little"))
    for _ in range(MAX_CHUNKS):
        if pos + 8 > end:
            return 1
        size = int.from_bytes(data[pos + 4 : pos + 8], "little")
        if data[pos : pos + 4] == b"EXIF":
            return from_tiff(data, pos + 8, pos + 8 + size)
        pos += 8 + size + (size & 1)  # chunks are padded to an even length
    return 1


def from_jpeg(data: bytes) -> int:
    from gateway.imaging import jpeg  # the segment walker lives with the JPEG code

    found = jpeg.exif_segment(data)
    return 1 if found is None else from_tiff(data, *found)


def of(data: bytes) -> int:
    """The orientation of JPEG, PNG or WebP bytes, told apart by signature; 1 for others."""
    if data.startswith(b"\xff\xd8"):
        return from_jpeg(data)
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return from_png(data)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return from_webp(data)
    return 1


#: Array transforms that turn a stored image upright, as a viewer would (views, no copies).
_UPRIGHT: dict[int, Callable[[np.ndarray], np.ndarray]] = {
    2: lambda a: a[:, ::-1],
    3: lambda a: a[::-1, ::-1],
    4: lambda a: a[::-1, :],
    5: lambda a: a.transpose(1, 0, 2),
    6: lambda a: np.rot90(a, -1),
    7: lambda a: a.transpose(1, 0, 2)[::-1, ::-1],
    8: lambda a: np.rot90(a, 1),
}


def upright(pixels: np.ndarray, orientation: int) -> np.ndarray:
    """``pixels`` (``[h, w, c]``) as they should be seen; a view when anything changes."""
    transform = _UPRIGHT.get(orientation)
    return pixels if transform is None else transform(pixels)
