"""JPEG decoding at the smallest power-of-two DCT scale that still covers the target size.

libjpeg-turbo (bundled by simplejpeg) can run its inverse DCT at 1/2, 1/4 or 1/8 size, so a 12 MP
photo becomes a 504x378 image without ever existing at full size. Only power-of-two scales are
used: the n/8 scales in between take libjpeg-turbo's slow non-SIMD path and decode a compact
341x256 JPEG at 7/8 twice as slowly as at full size.

Progressive JPEGs need one more step to profit. At 1/8 scale each 8x8 block becomes one pixel,
computed from its DC coefficient alone, but libjpeg still entropy-decodes every AC scan, which is
most of the file and most of the time. :func:`strip_ac_scans` rewrites the stream keeping only
the DC scans (the ones with spectral start 0); libjpeg then decodes a valid, shorter progressive
JPEG, 3-5x faster. The output differs from a full decode only where libjpeg's block smoothing
and chroma upsampling would have used low AC terms: on average under 1/255 per channel.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import simplejpeg

#: Any marker but RSTn (d0-d7), byte stuffing (00) and fill bytes (ff): ends a scan's data.
_MARKER = re.compile(rb"\xff[\xc0-\xcf\xd8-\xfe]")
_SOF_PROGRESSIVE = {0xC2, 0xC6, 0xCA}
_SOS, _EOI, _APP1, _SOI = 0xDA, 0xD9, 0xE1, b"\xff\xd8"
_STANDALONE = {0x01, *range(0xD0, 0xD8)}  # markers without a length field


class JpegError(ValueError):
    """Not a decodable JPEG, or one whose structure breaks our limits."""


@dataclass(frozen=True)
class JpegHeader:
    width: int
    height: int
    colorspace: str  # simplejpeg's name: 'Gray', 'YCbCr', 'RGB', 'CMYK', 'YCCK'


@dataclass(frozen=True)
class ScanInfo:
    progressive: bool
    scans: int
    dc_only: bytes | None  # the stream without its AC scans (progressive only)


def read_header(data: bytes) -> JpegHeader:
    try:
        height, width, colorspace, _subsampling = simplejpeg.decode_jpeg_header(data)
    except ValueError as exc:
        raise JpegError(f"unreadable JPEG header: {exc}") from exc
    if width <= 0 or height <= 0:
        raise JpegError("JPEG header declares an empty image")
    return JpegHeader(int(width), int(height), str(colorspace))


def scale_divisor(width: int, height: int, target: int) -> int:
    """Largest of 1, 2, 4, 8 that keeps the short side at or above ``target``."""
    short = min(width, height)
    for divisor in (8, 4, 2):
        if short // divisor >= target:
            return divisor
    return 1


def inspect_scans(data: bytes, *, max_scans: int, want_dc_only: bool) -> ScanInfo:
    """Walk the marker structure: count scans, and cut the AC scans out if asked.

    Baseline files return after their first SOS (nothing after it matters to us). Structure we
    cannot follow ends the walk without a cut; the decoder then reports the real error, if any.
    """
    end, pos = len(data), 2
    progressive, scans, kept = False, 0, [_SOI]
    while pos + 4 <= end:
        if data[pos] != 0xFF:
            return ScanInfo(progressive, scans, None)
        marker = data[pos + 1]
        if marker == _EOI:
            break
        if marker == 0xFF or marker in _STANDALONE:  # fill byte, or a marker without length
            pos += 1 if marker == 0xFF else 2
            continue
        segment_end = pos + 2 + int.from_bytes(data[pos + 2 : pos + 4], "big")
        progressive = progressive or marker in _SOF_PROGRESSIVE
        if marker != _SOS:
            kept.append(data[pos:segment_end])
            pos = segment_end
            continue
        scans += 1
        if not progressive:
            return ScanInfo(False, scans, None)
        if scans > max_scans:
            raise JpegError(f"progressive JPEG has more than {max_scans} scans")
        scan_end = _scan_end(data, pos, segment_end)
        if scan_end is None:
            return ScanInfo(progressive, scans, None)
        if data[pos + 5 + 2 * data[pos + 4]] == 0:  # spectral selection starts at 0: a DC scan
            kept.append(data[pos:scan_end])
        pos = scan_end
    if not (progressive and want_dc_only):
        return ScanInfo(progressive, scans, None)
    kept.append(b"\xff\xd9")
    return ScanInfo(True, scans, b"".join(kept))


def _scan_end(data: bytes, sos: int, header_end: int) -> int | None:
    """Where the entropy-coded data after the SOS header at ``sos`` ends (None: malformed)."""
    if sos + 4 >= len(data) or sos + 5 + 2 * data[sos + 4] >= min(header_end, len(data)):
        return None
    found = _MARKER.search(data, header_end)
    return found.start() if found else len(data)


def exif_segment(data: bytes) -> tuple[int, int] | None:
    """Where the APP1 Exif payload is (``data[start:end]``, starting ``Exif\\0\\0``), found by
    walking the segments before the first scan; None when there is none or it is cut short.

    Pillow would find it too, but only by parsing every header segment (quantisation tables
    included) in Python, which the bench's GIL profile showed as a visible cost.
    """
    pos, end = 2, len(data)
    while pos + 4 <= end and data[pos] == 0xFF:
        marker = data[pos + 1]
        if marker in (_SOS, _EOI):
            return None
        if marker == 0xFF or marker in _STANDALONE:
            pos += 1 if marker == 0xFF else 2
            continue
        segment_end = pos + 2 + int.from_bytes(data[pos + 2 : pos + 4], "big")
        if marker == _APP1 and data[pos + 4 : pos + 10] == b"Exif\x00\x00":
            return (pos + 4, segment_end) if segment_end <= end else None
        pos = segment_end
    return None


def decode_scaled(
    data: bytes, header: JpegHeader, target: int, *, max_scans: int, dc_only: bool
) -> np.ndarray:
    """RGB uint8 ``[h, w, 3]`` at the power-of-two scale whose short side is still >= target."""
    divisor = scale_divisor(header.width, header.height, target)
    info = inspect_scans(data, max_scans=max_scans, want_dc_only=dc_only and divisor == 8)
    # Asking for ceil(size/divisor) makes libjpeg pick exactly 1/divisor: the next smaller n/8
    # falls short of it.
    min_height, min_width = -(-header.height // divisor), -(-header.width // divisor)
    if info.dc_only is not None:
        try:
            return _decode(info.dc_only, min_height, min_width)
        except ValueError:
            pass  # something our cut could not express: let the full stream decide
    try:
        return _decode(data, min_height, min_width)
    except ValueError as exc:
        raise JpegError(f"corrupt or truncated JPEG: {exc}") from exc


def _decode(data: bytes, min_height: int, min_width: int) -> np.ndarray:
    return simplejpeg.decode_jpeg(  # type: ignore[no-any-return]
        data, colorspace="RGB", min_height=min_height, min_width=min_width
    )
