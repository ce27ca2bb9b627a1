"""EXIF orientation (tag 0x0112): read from the EXIF block the format walkers find (JPEG APP1,
PNG eXIf, WebP EXIF), and applied. One implementation for the gateway and the client.

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
            return value if value in _UPRIGHT else 1  # 2-8; 1 and out-of-range values: upright
    return 1


def of(data: bytes) -> int:
    """The orientation of JPEG, PNG or WebP bytes, told apart by signature; 1 for other formats
    and for anything malformed."""
    from clip_gateway.imaging import containers, jpeg  # the walkers live with their formats

    try:
        if data.startswith(b"\xff\xd8"):
            span = jpeg.exif_segment(data)
        elif data.startswith(b"\x89PNG\r\n\x1a\n"):
            span = containers.png(data).exif
        elif data[:4] == b"RIFF" and data[8:12] == b"WEBP":
            span = containers.webp(data).exif
        else:
            return 1
    except ValueError:
        return 1
    return from_tiff(data, *span) if span else 1


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


Box = tuple[float, float, float, float]


def source_box(box: Box, width: int, height: int, orientation: int) -> Box:
    """``box`` (left, top, right, bottom; pixel edges) on the upright image, as the box on the
    stored ``width`` x ``height`` image it comes from: what ``upright`` turns it into."""
    left, top, right, bottom = box
    if orientation in (2, 3):  # mirrored left-right (3: and top-bottom)
        left, right = width - right, width - left
    if orientation in (3, 4):
        top, bottom = height - bottom, height - top
    if orientation < 5:
        return left, top, right, bottom
    # transposed: upright x runs along stored y, upright y along stored x
    xs = (top, bottom) if orientation in (5, 6) else (width - bottom, width - top)
    ys = (left, right) if orientation in (5, 8) else (height - right, height - left)
    return xs[0], ys[0], xs[1], ys[1]
