"""JPEG: one bounded walk of the marker structure, then a decode at the smallest power-of-two DCT
scale that still covers the target size.

libjpeg-turbo (bundled by simplejpeg) can run its inverse DCT at 1/2, 1/4 or 1/8 size, so a 12 MP
photo becomes a 504x378 image without ever existing at full size. Only power-of-two scales are
used: the n/8 scales in between take libjpeg-turbo's slow non-SIMD path and decode a compact
341x256 JPEG at 7/8 twice as slowly as at full size.

Progressive JPEGs need one more step to profit. At 1/8 scale each 8x8 block becomes one pixel,
computed from its DC coefficient alone, but libjpeg still entropy-decodes every AC scan, which is
most of the file and most of the time. The walk can rewrite the stream keeping only the DC scans
(spectral start 0); libjpeg then decodes a valid, shorter progressive JPEG, 3-5x faster. The
output differs from a full decode only where libjpeg's block smoothing and chroma upsampling would
have used low AC terms: on average under 1/255 per channel.

The walk is also what bounds the decoder: it reads the frame header (size, components, sampling,
coding), counts every scan the decoder would run and finds the EXIF block, in a number of steps
capped by ``MAX_SEGMENTS``; entropy-coded data is skipped with a compiled regex, never a Python
loop per byte. Multi-scan files (progressive, or sequential with components in separate scans)
make libjpeg hold a whole-image coefficient buffer; ``JpegLayout.coefficient_bytes`` says how
large, so the caller can refuse it before paying it.
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
from dataclasses import dataclass

import numpy as np
import simplejpeg

#: Segments (markers) walked before a file is refused as built to waste time.
MAX_SEGMENTS = 2048
#: Ends entropy-coded data: any marker but RSTn (d0-d7), byte stuffing (00) and fill (ff).
_SCAN_END = re.compile(rb"\xff[\xc0-\xcf\xd8-\xfe]")
#: Where libjpeg resynchronises after junk between segments: the next marker of any kind.
_NEXT_MARKER = re.compile(rb"\xff[\x01\xc0-\xfe]")
_FILL = re.compile(rb"\xff+")
_SOI, _EOI, _SOS, _APP1 = b"\xff\xd8", 0xD9, 0xDA, 0xE1
_STANDALONE = {0x01, 0xD8, *range(0xD0, 0xD8)}  # markers without a length field
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_PROGRESSIVE = {0xC2, 0xC6, 0xCA, 0xCE}
_ARITHMETIC = {0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_LOSSLESS_OR_HIERARCHICAL = {0xC3, 0xC5, 0xC6, 0xC7, 0xCB, 0xCD, 0xCE, 0xCF}


class JpegError(ValueError):
    """Not a decodable JPEG, or one whose structure breaks our limits."""


class UnsupportedJpeg(JpegError):
    """A valid JPEG of a kind the decoder cannot scale (lossless, hierarchical, 12-bit)."""


@dataclass(frozen=True)
class JpegHeader:
    width: int
    height: int
    colorspace: str  # simplejpeg's name: 'Gray', 'YCbCr', 'RGB', 'CMYK', 'YCCK'


@dataclass(frozen=True)
class JpegLayout:
    width: int
    height: int
    #: (horizontal, vertical) sampling factors, one pair per component.
    sampling: tuple[tuple[int, int], ...]
    progressive: bool
    #: Scans walked, and those with spectral start 0 (all a DC-only decode runs).
    scans: int
    dc_scans: int
    #: libjpeg buffers the whole image's coefficients (progressive, or sequential multi-scan).
    multi_scan: bool
    #: ``data[start:end]`` of the APP1 Exif payload (starting ``Exif\\0\\0``), if any.
    exif: tuple[int, int] | None
    #: The stream without its AC scans (progressive, when asked for and worthwhile).
    dc_only: bytes | None = None
    #: Arithmetic-coded (SOF9/SOF10): decoded, at ~15x a Huffman file's cost per byte.
    arithmetic: bool = False

    @functools.cached_property
    def blocks(self) -> int:
        """8x8 blocks of all components (what every decoded scan visits); worked out once
        (admission prices by it, the decoder checks its limit by it)."""
        hmax = max(h for h, _ in self.sampling)
        vmax = max(v for _, v in self.sampling)
        return sum(
            math.ceil(math.ceil(self.width * h / hmax) / 8)
            * math.ceil(math.ceil(self.height * v / vmax) / 8)
            for h, v in self.sampling
        )

    @property
    def coefficient_bytes(self) -> int:
        """libjpeg's whole-image coefficient buffer (64 int16 per block), allocated when the
        decode starts for progressive and multi-scan files; 0 for a single sequential scan."""
        return self.blocks * 128 if self.progressive or self.multi_scan else 0


def read_header(data: bytes) -> JpegHeader:
    try:
        height, width, colorspace, _subsampling = simplejpeg.decode_jpeg_header(data)
    except ValueError as exc:
        raise JpegError(f"unreadable JPEG header: {exc}") from exc
    # (libjpeg refuses a frame of no rows or no columns itself: tests/unit/imaging/test_jpeg.py)
    return JpegHeader(int(width), int(height), str(colorspace))


@dataclass(frozen=True)
class JpegFrame:
    width: int
    height: int
    progressive: bool
    arithmetic: bool


def frame(data: bytes) -> JpegFrame:
    """The frame header's size and coding (``frame_layout``'s): what admission prices a JPEG by.
    Raises ``JpegError`` (a ValueError) when there is none."""
    layout = frame_layout(data)
    return JpegFrame(layout.width, layout.height, layout.progressive, layout.arithmetic)


def frame_layout(data: bytes) -> JpegLayout:
    """The layout up to the frame header (no scans counted), walking the segments before it
    bounded as ``walk`` is."""
    if not data.startswith(_SOI):
        raise JpegError("not a JPEG: no start-of-image marker")
    walker = _Walk(data, 1, None)
    walker.stop_at_frame = True
    return walker.run()


def scale_divisor(width: int, height: int, target: int, *, long_side: bool = False) -> int:
    """Largest of 1, 2, 4, 8 that keeps the short side (``long_side``: the long side, for a
    resize that fits the whole image into the target) at or above ``target``."""
    side = max(width, height) if long_side else min(width, height)
    for divisor in (8, 4, 2):
        if side >= divisor * target:
            return divisor
    return 1


def walk(
    data: bytes, *, max_scans: int, dc_only_for: int | None = None, long_side: bool = False
) -> JpegLayout:
    """The marker structure of ``data``; with ``dc_only_for=target``, also the DC-only stream
    when the file is progressive and will be decoded at 1/8 for that target size.

    Raises ``JpegError`` for structure no decoder would accept (no frame header, a scan before it,
    impossible lengths) or that breaks a limit (scans, segments), ``UnsupportedJpeg`` for kinds that
    cannot be decoded scaled. A stream cut short ends the walk: the decoder reports it.
    """
    if not data.startswith(_SOI):
        raise JpegError("not a JPEG: no start-of-image marker")
    if max_scans >= 1:
        for head, layout in _recent:
            if data.startswith(head):
                return layout
    walker = _Walk(data, max_scans, dc_only_for, long_side)
    layout = walker.run()
    if walker.sealed_at is not None and walker.sealed_at <= MAX_REMEMBERED_HEAD:
        _remember(data[: walker.sealed_at], layout)
    return layout


#: The longest header ``walk`` remembers (a photo with a large EXIF block is walked every time).
MAX_REMEMBERED_HEAD = 4096
#: Headers remembered, most recent first.
RECENT_HEADS = 8
#: (header, its layout) of the last single-scan sequential files walked. Such a file's layout
#: is a function of its bytes up to the end of its scan header alone (the walk stops there:
#: nothing after it costs the decoder anything), and one encoder's files of one size share
#: those bytes (the SDK's uploads: 224x224, the same tables): a file that starts with a
#: remembered header has that layout, found by a comparison of a few hundred bytes instead of a
#: walk in Python (~10 us an image on the event loop, where admission prices each image). Only an
#: exact match is a hit, so no input can make another's layout its own. A tuple replaced whole:
#: the event loop and the decode threads read it without a lock.
_recent: tuple[tuple[bytes, JpegLayout], ...] = ()


def _remember(head: bytes, layout: JpegLayout) -> None:
    global _recent
    _recent = ((head, layout), *(entry for entry in _recent if entry[0] != head))[:RECENT_HEADS]


_Frame = tuple[int, int, tuple[tuple[int, int], ...], bool]  # width, height, sampling, progressive


class _Walk:
    def __init__(
        self, data: bytes, max_scans: int, dc_only_for: int | None, long_side: bool = False
    ) -> None:
        self.data, self.end, self.pos = data, len(data), 2
        self.max_scans, self.dc_only_for, self.long_side = max_scans, dc_only_for, long_side
        self.frame: _Frame | None = None
        self.scans = self.dc_scans = 0
        self.multi_scan = False
        self.exif: tuple[int, int] | None = None
        self.arithmetic = False
        self.stop_at_frame = False
        #: Where the walk ended for good, at the end of a sequential file's one scan header: the
        #: layout depends on nothing after it (``walk`` remembers it).
        self.sealed_at: int | None = None
        # the DC-only stream: header segments and DC scans, dropped once the frame says it will
        # not be used (not progressive, or not decoded at 1/8)
        self.kept: list[bytes] | None = [_SOI] if dc_only_for else None

    def run(self) -> JpegLayout:
        # every image is walked on the event loop when admission prices it: the common steps
        # (a marker right where the last segment ended, a segment skipped whole) are inline
        data, end = self.data, self.end
        for _ in range(MAX_SEGMENTS):
            pos = self.pos
            if pos + 1 < end and data[pos] == 0xFF and data[pos + 1] != 0xFF:
                marker: int | None = data[pos + 1]
            else:
                marker, pos = self._next_marker(), self.pos
            if marker is None or marker == _EOI:
                break
            if marker in _STANDALONE:
                self.pos = pos + 2
                continue
            # the big-endian length after the marker (-1: the file ends before it)
            segment_end = pos + 2 + (data[pos + 2] << 8 | data[pos + 3]) if pos + 4 <= end else -1
            if not pos + 4 <= segment_end <= end:
                if segment_end < 0 or segment_end > end:
                    break  # cut short
                raise JpegError("JPEG segment with an impossible length")
            if marker == _SOS:
                if self._scan(segment_end):
                    layout = self._layout()  # raises without a frame: nothing sealed
                    self.sealed_at = segment_end
                    return layout
                continue
            if self.kept is None and marker != _APP1 and marker not in _SOF:
                self.pos = segment_end  # nothing in it matters (tables, comments, APPn)
                continue
            self._segment(marker, segment_end)
            if self.stop_at_frame and self.frame is not None:
                break
        else:
            raise JpegError(f"JPEG has more than {MAX_SEGMENTS} segments")
        return self._layout()

    def _next_marker(self) -> int | None:
        """Move to the next marker (past junk and fill bytes, as libjpeg does); its code. (A
        marker right here, the common case, ``run`` takes inline without calling this.)"""
        data, pos = self.data, self.pos
        if pos < self.end and data[pos] != 0xFF:
            found = _NEXT_MARKER.search(data, pos)
            pos = found.start() if found else self.end
        fill = _FILL.match(data, pos)
        if fill is None or fill.end() >= self.end:
            return None
        self.pos = fill.end() - 1  # the last ff of a fill run
        return data[self.pos + 1]

    def _segment(self, marker: int, segment_end: int) -> None:
        data, pos = self.data, self.pos
        if marker in _SOF:
            if self.frame is not None:
                raise UnsupportedJpeg("JPEG with more than one frame (hierarchical)")
            self.frame = width, height, _, progressive = _frame(data, pos, segment_end, marker)
            self.arithmetic = marker in _ARITHMETIC
            target = self.dc_only_for
            eighth = target and scale_divisor(width, height, target, long_side=self.long_side) == 8
            if not (progressive and eighth):
                self.kept = None
        elif (
            marker == _APP1
            and self.exif is None
            and not self.scans  # Pillow reads Exif before the first scan only; so must we
            and data[pos + 4 : pos + 10] == b"Exif\x00\x00"
        ):
            self.exif = (pos + 4, segment_end)
        if self.kept is not None:
            self.kept.append(data[pos:segment_end])
        self.pos = segment_end

    def _scan(self, segment_end: int) -> bool:
        """Count one scan and skip its entropy-coded data; True: nothing after it matters."""
        if self.frame is None:
            raise JpegError("JPEG scan before its frame header")
        data, pos = self.data, self.pos
        sampling, progressive = self.frame[2], self.frame[3]
        components = data[pos + 4]
        if not 1 <= components <= len(sampling) or pos + 8 + 2 * components > segment_end:
            raise JpegError("malformed JPEG scan header")
        self.scans += 1
        if self.scans > self.max_scans:
            raise JpegError(f"JPEG has more than {self.max_scans} scans")
        is_dc = data[pos + 5 + 2 * components] == 0  # spectral selection starts at 0
        self.dc_scans += is_dc
        if self.scans == 1 and not progressive and components == len(sampling):
            # One interleaved sequential scan: libjpeg decodes the whole image in this pass
            # and refuses any further scan, so nothing after it can cost anything.
            return True
        self.multi_scan = True
        found = _SCAN_END.search(data, segment_end)
        scan_end = found.start() if found else self.end
        if self.kept is not None and is_dc:
            self.kept.append(data[pos:scan_end])
        self.pos = scan_end
        return False

    def _layout(self) -> JpegLayout:
        if self.frame is None:
            raise JpegError("JPEG without a frame header (truncated or corrupt)")
        width, height, sampling, progressive = self.frame
        dc_only = None
        if self.kept is not None and self.scans:
            dc_only = b"".join([*self.kept, b"\xff\xd9"])
        return JpegLayout(
            width,
            height,
            sampling,
            progressive,
            self.scans,
            self.dc_scans,
            self.multi_scan,
            self.exif,
            dc_only,
            self.arithmetic,
        )


def _frame(
    data: bytes, pos: int, end: int, marker: int
) -> tuple[int, int, tuple[tuple[int, int], ...], bool]:
    if marker in _LOSSLESS_OR_HIERARCHICAL:
        raise UnsupportedJpeg("lossless and hierarchical JPEGs are not supported")
    if end < pos + 10:
        raise JpegError(f"JPEG frame header cut short ({end - pos - 4} bytes; it needs 6)")
    if data[pos + 4] != 8:
        raise UnsupportedJpeg(f"{data[pos + 4]}-bit JPEG samples are not supported (only 8)")
    height = int.from_bytes(data[pos + 5 : pos + 7])  # big-endian, the default
    width = int.from_bytes(data[pos + 7 : pos + 9])
    count = data[pos + 9]
    if not width or not height:
        raise JpegError("JPEG frame header declares an empty image")
    if count not in (1, 3, 4) or end < pos + 10 + 3 * count:
        raise JpegError(f"JPEG frame header with {count} components")
    factors = data[pos + 11 : pos + 11 + 3 * count : 3]
    sampling = tuple((f >> 4, f & 0x0F) for f in factors)
    for h, v in sampling:
        if not (1 <= h <= 4 and 1 <= v <= 4):
            raise JpegError("JPEG frame header with impossible sampling factors")
    return width, height, sampling, marker in _PROGRESSIVE


def exif_segment(data: bytes) -> tuple[int, int] | None:
    """Where the APP1 Exif payload is (``data[start:end]``, starting ``Exif\\0\\0``), if the
    walk reaches one before the first scan, whatever is wrong with the rest of the file."""
    if not data.startswith(_SOI):
        return None
    walker = _Walk(data, 0, None)  # the first scan ends the walk: Exif after it is not read
    with contextlib.suppress(JpegError):
        walker.run()
    return walker.exif


def decode(
    data: bytes,
    layout: JpegLayout,
    target: int,
    *,
    rgbx: bool = False,
    long_side: bool = False,
    full_size: bool = False,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """RGB uint8 ``[h, w, 3]`` (``[h, w, 4]`` RGBX with ``rgbx``, the layout Pillow keeps RGB
    in, so it can use the array without a copy) at the power-of-two scale whose short side
    (``long_side``: long side) is still >= target (from the DC-only stream when the walk made
    one), or every pixel with ``full_size``. CMYK and YCCK become RGB. ``out``: a C-contiguous
    array to decode into (what is returned is a view of its first bytes); too small for the
    image, a ``JpegError``."""
    divisor = 1 if full_size else scale_divisor(layout.width, layout.height, target,
                                                long_side=long_side)  # fmt: skip
    # Asking for ceil(size/divisor) makes libjpeg pick exactly 1/divisor: the next smaller n/8
    # falls short of it.
    min_height, min_width = -(-layout.height // divisor), -(-layout.width // divisor)
    colorspace = "RGBX" if rgbx else "RGB"
    if layout.dc_only is not None:
        try:
            return _decode(layout.dc_only, min_height, min_width, colorspace, out)
        except ValueError:
            pass  # something our cut could not express: let the full stream decide
    try:
        return _decode(data, min_height, min_width, colorspace, out)
    except ValueError as exc:
        raise JpegError(f"corrupt or truncated JPEG: {exc}") from exc


def decode_scaled(
    data: bytes,
    target: int,
    *,
    max_scans: int,
    dc_only: bool,
    long_side: bool = False,
) -> np.ndarray:
    """Walk and decode in one call (the client's compact upload)."""
    layout = walk(
        data, max_scans=max_scans, dc_only_for=target if dc_only else None, long_side=long_side
    )
    return decode(data, layout, target, long_side=long_side)


def _decode(
    data: bytes, min_height: int, min_width: int, colorspace: str, out: np.ndarray | None = None
) -> np.ndarray:
    return simplejpeg.decode_jpeg(  # type: ignore[no-any-return]
        data, colorspace=colorspace, min_height=min_height, min_width=min_width, buffer=out
    )
