"""DCT-scaled JPEG decoding and the AC-scan cut for progressive files."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import simplejpeg
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.harness.photos import jpeg as encode_jpeg
from clip_gateway.client.compact import CompactOptions, compact
from clip_gateway.imaging import jpeg
from tests import samples


@pytest.mark.parametrize(
    ("size", "divisor"),
    [((4032, 3024), 8), ((2000, 1500), 4), ((1000, 600), 2), ((341, 256), 1), ((100, 80), 1),
     ((1792, 1792), 8), ((1791, 4000), 4)],
)  # fmt: skip
def test_scale_divisor_keeps_short_side_at_least_the_target(size, divisor) -> None:
    assert jpeg.scale_divisor(*size, 224) == divisor


@pytest.mark.parametrize(
    ("size", "expected_shape"),
    [((4032, 3024), (378, 504, 3)), ((2000, 1500), (375, 500, 3)), ((341, 256), (256, 341, 3))],
)
def test_decode_uses_power_of_two_scales_only(size, expected_shape) -> None:
    data = encode_jpeg(samples.camera_photo(*size, seed=1))
    header = jpeg.read_header(data)
    assert (header.width, header.height) == size
    out = jpeg.decode_scaled(data, 224, max_scans=256, dc_only=True)
    assert out.shape == expected_shape  # 341x256 is decoded whole, not at the slow 7/8 scale


def summary(layout: jpeg.JpegLayout) -> tuple[bool, int, bytes | None]:
    return layout.progressive, layout.scans, layout.dc_only


def test_baseline_needs_no_cut() -> None:
    layout = jpeg.walk(samples.compact(0), max_scans=256, dc_only_for=1)
    assert summary(layout) == (False, 1, None)
    assert (layout.multi_scan, layout.coefficient_bytes) == (False, 0)


def test_progressive_cut_keeps_only_dc_scans_and_stays_close() -> None:
    data = samples.progressive_jpeg(3)
    info = jpeg.walk(data, max_scans=256, dc_only_for=224)
    assert info.progressive and info.scans >= 6
    assert info.dc_only is not None and len(info.dc_only) < len(data) / 5
    full = simplejpeg.decode_jpeg(data, min_height=225, min_width=300)
    cut = simplejpeg.decode_jpeg(info.dc_only, min_height=225, min_width=300)
    assert full.shape == cut.shape == (225, 300, 3)
    assert np.abs(full.astype(int) - cut).mean() < 2.0


def test_scan_limit_refuses_deeply_progressive_files() -> None:
    with pytest.raises(jpeg.JpegError, match="more than 3 scans"):
        jpeg.walk(samples.progressive_jpeg(3), max_scans=3)


def test_unreadable_header() -> None:
    with pytest.raises(jpeg.JpegError):
        jpeg.read_header(b"\xff\xd8\xff\xe0garbage")


PROGRESSIVE = samples.progressive_jpeg(5, (640, 480))


def test_stream_cut_inside_a_scan_header() -> None:
    sos = PROGRESSIVE.index(b"\xff\xda")
    for end in range(sos, sos + 16):  # found by the fuzz test below
        with contextlib.suppress(jpeg.JpegError):
            jpeg.walk(PROGRESSIVE[:end], max_scans=64, dc_only_for=1)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_cut_never_crashes_on_damaged_streams(data: st.DataObject) -> None:
    """Flip, drop and truncate bytes: the walker returns or raises JpegError, nothing else."""
    stream = bytearray(PROGRESSIVE)
    for _ in range(data.draw(st.integers(1, 8))):
        position = data.draw(st.integers(0, len(stream) - 1))
        stream[position] = data.draw(st.integers(0, 255))
    stream = stream[: data.draw(st.integers(2, len(stream)))]
    with contextlib.suppress(jpeg.JpegError):
        jpeg.walk(bytes(stream), max_scans=64, dc_only_for=1)


def test_exif_segment_found_without_parsing_the_rest() -> None:
    data = samples.oriented_jpeg(6)
    found = jpeg.exif_segment(data)
    assert found is not None
    start, end = found
    assert data[start : start + 6] == b"Exif\x00\x00"
    assert int.from_bytes(data[start - 2 : start], "big") == end - start + 2  # the APP1 length
    assert jpeg.exif_segment(samples.compact(0)) is None  # no APP1 Exif at all
    assert jpeg.exif_segment(samples.oriented_jpeg(6)[:30]) is None  # cut inside it
    assert jpeg.exif_segment(b"\xff\xd8") is None


# --- hand-built marker streams: the walkers' exact output ---------------------------------------
# The walkers follow marker structure only, so these need not be decodable images.


def segment(marker: int, payload: bytes) -> bytes:
    return bytes([0xFF, marker]) + (len(payload) + 2).to_bytes(2, "big") + payload


def sos(spectral_start: int) -> bytes:
    """A scan header for one component (Ns=1: Cs, Td/Ta, Ss, Se, Ah/Al)."""
    return segment(0xDA, bytes([1, 1, 0x00, spectral_start, 63 if spectral_start else 0, 0x00]))


SOI, EOI = b"\xff\xd8", b"\xff\xd9"
COMMENT = segment(0xFE, b"c" * 300)  # longer than 255: both length bytes count
SOF0 = segment(0xC0, b"\x08\x00\x10\x00\x10\x01\x01\x11\x00")
SOF2 = segment(0xC2, b"\x08\x00\x10\x00\x10\x01\x01\x11\x00")
# stuffed 0xff00 and a restart marker (ffd0) are part of the entropy-coded data, not its end
DC_SCAN = sos(0) + b"\x12\xff\x00\x34\xff\xd0\x56"
AC_SCAN = sos(1) + b"\xab\xcd"


def test_cut_keeps_header_segments_and_dc_scans_byte_for_byte() -> None:
    stream = (
        SOI + COMMENT + b"\xff" + SOF2  # a fill byte before a marker
        + b"\xff\x01" + DC_SCAN  # TEM: a marker without a length field
        + AC_SCAN + EOI + b"\x00\x00trailing bytes after EOI are not read"
    )  # fmt: skip
    layout = jpeg.walk(stream, max_scans=2, dc_only_for=1)
    assert summary(layout) == (True, 2, SOI + COMMENT + SOF2 + DC_SCAN + EOI)
    assert (layout.dc_scans, layout.multi_scan) == (1, True)
    assert summary(jpeg.walk(stream, max_scans=2)) == (True, 2, None)
    with pytest.raises(jpeg.JpegError, match=r"^JPEG has more than 1 scans$"):
        jpeg.walk(stream, max_scans=1, dc_only_for=1)


def test_cut_keeps_a_segment_that_ends_exactly_at_the_end() -> None:
    empty_comment = segment(0xFE, b"")  # 4 bytes, the last of the data (no EOI)
    info = jpeg.walk(SOI + SOF2 + DC_SCAN + empty_comment, max_scans=8, dc_only_for=1)
    assert info.dc_only == SOI + SOF2 + DC_SCAN + empty_comment + EOI


def test_scan_header_is_read_up_to_its_spectral_start() -> None:
    short = segment(0xDA, bytes([1, 1, 0x00, 0])) + b"\x12\x34"  # ends right after Ss
    with pytest.raises(jpeg.JpegError, match="malformed JPEG scan header"):
        jpeg.walk(SOI + SOF2 + short + AC_SCAN, max_scans=8, dc_only_for=1)


@pytest.mark.parametrize(
    ("stream", "expected"),
    [
        (SOI + SOF0 + COMMENT, (False, 0, None)),  # baseline, no scan at all
        (SOI + SOF0 + sos(0) + b"\x00" + AC_SCAN, (False, 1, None)),  # one scan: the end
        (SOI + SOF2 + b"\xff\xda\x00\x08\x01", (True, 0, None)),  # cut inside the SOS
    ],
    ids=["header-only", "baseline", "truncated-sos"],
)
def test_walk_ends_without_a_cut(stream: bytes, expected: tuple[bool, int, None]) -> None:
    assert summary(jpeg.walk(stream, max_scans=8, dc_only_for=1)) == expected


@pytest.mark.parametrize(
    "junk", [b"\x00", b"junk between segments", b"\x00" * 5000], ids=["byte", "text", "long"]
)
def test_junk_between_segments_is_skipped_as_libjpeg_does(junk: bytes) -> None:
    """libjpeg resynchronises on the next marker, so scans after junk still count."""
    stream = SOI + SOF2 + junk + DC_SCAN + junk + AC_SCAN + EOI
    assert summary(jpeg.walk(stream, max_scans=8)) == (True, 2, None)
    with pytest.raises(jpeg.JpegError, match="more than 1 scans"):
        jpeg.walk(stream, max_scans=1)


def test_fill_byte_runs_are_skipped_in_one_step() -> None:
    stream = SOI + b"\xff" * 100_000 + SOF2 + DC_SCAN + EOI
    assert summary(jpeg.walk(stream, max_scans=8)) == (True, 1, None)


def test_sequential_scans_per_component_count_and_buffer() -> None:
    """A baseline frame whose components come in separate scans: libjpeg buffers the whole
    image's coefficients, and every scan counts against the limit."""
    sof = segment(0xC0, b"\x08\x00\x10\x00\x20\x03" + b"\x01\x22\x00\x02\x11\x00\x03\x11\x00")
    scans = b"".join(segment(0xDA, bytes([1, c, 0x00, 0, 63, 0])) + b"\x12" for c in (1, 2, 3))
    layout = jpeg.walk(SOI + sof + scans + EOI, max_scans=8)
    assert (layout.progressive, layout.scans, layout.multi_scan) == (False, 3, True)
    assert layout.dc_scans == 3  # each starts at spectral 0 (and ends at 63)
    # 32x16 at 4:2:0: 4x2 luma blocks + 2x1 for each chroma plane, 128 bytes each
    assert (layout.blocks, layout.coefficient_bytes) == (12, 12 * 128)
    with pytest.raises(jpeg.JpegError, match="more than 2 scans"):
        jpeg.walk(SOI + sof + scans + EOI, max_scans=2)


def test_too_many_segments_is_refused() -> None:
    stream = SOI + segment(0xFE, b"x") * (jpeg.MAX_SEGMENTS + 1) + SOF0 + sos(0) + EOI
    with pytest.raises(jpeg.JpegError, match="segments"):
        jpeg.walk(stream, max_scans=8)


@pytest.mark.parametrize(
    ("marker", "precision"), [(0xC3, 8), (0xC5, 8), (0xC0, 12)], ids=["lossless", "hier", "12bit"]
)
def test_kinds_that_cannot_be_decoded_scaled_are_unsupported(marker: int, precision: int) -> None:
    sof = segment(marker, bytes([precision]) + b"\x00\x10\x00\x10\x01\x01\x11\x00")
    with pytest.raises(jpeg.UnsupportedJpeg):
        jpeg.walk(SOI + sof + sos(0) + EOI, max_scans=8)


@pytest.mark.parametrize(
    "stream",
    [
        SOI + sos(0) + EOI,  # a scan before any frame header
        SOI + COMMENT + EOI,  # no frame header at all
        SOI + b"\xff\xfe\x00\x01" + SOF0,  # a length below 2
        SOI + segment(0xC0, b"\x08\x00\x00\x00\x10\x01\x01\x11\x00") + EOI,  # height 0
        SOI + segment(0xC0, b"\x08\x00\x10\x00\x10\x01\x01\x51\x00") + EOI,  # sampling 5
        b"\x89PNG not a jpeg",
    ],
    ids=["scan-first", "no-frame", "short-length", "empty", "sampling", "not-jpeg"],
)
def test_structure_no_decoder_accepts_is_refused(stream: bytes) -> None:
    with pytest.raises(jpeg.JpegError):
        jpeg.walk(stream, max_scans=8)


def test_exif_segment_is_the_app1_exif_payload_exactly() -> None:
    payload = b"Exif\x00\x00" + bytes(range(256)) * 2  # longer than 255 bytes
    stream = (
        SOI + b"\xff" + segment(0xE0, b"JFIF\x00\x01\x02")  # fill byte, then APP0
        + b"\xff\xd0"  # a stray marker without length
        + segment(0xFE, b"Exif\x00\x00 only a comment")  # not APP1
        + segment(0xE1, b"http://ns.adobe.com/xap/1.0/\x00<x/>")  # APP1, but XMP
        + segment(0xE1, payload) + SOF0 + sos(0)
    )  # fmt: skip
    start, end = jpeg.exif_segment(stream) or (0, 0)
    assert stream[start:end] == payload
    alone = SOI + segment(0xE1, payload)
    start, end = jpeg.exif_segment(alone) or (0, 0)
    assert (alone[start:end], end) == (payload, len(alone))  # ends with the data
    assert jpeg.exif_segment(SOI + segment(0xE1, payload)[:-1]) is None  # one byte short
    assert jpeg.exif_segment(SOI + SOF0 + sos(0) + segment(0xE1, payload)) is None  # after SOS


def test_header_fields() -> None:
    assert jpeg.read_header(samples.compact(0)) == jpeg.JpegHeader(341, 256, "YCbCr")
    assert jpeg.read_header(samples.grayscale_jpeg()) == jpeg.JpegHeader(640, 480, "Gray")
    assert jpeg.read_header(samples.cmyk_jpeg()) == jpeg.JpegHeader(640, 480, "CMYK")
    assert jpeg.read_header(samples.claims_pixels(1, 1)) == jpeg.JpegHeader(1, 1, "YCbCr")


def test_unreadable_header_message() -> None:
    with pytest.raises(jpeg.JpegError, match=r"^unreadable JPEG header: "):
        jpeg.read_header(b"\xff\xd8\xff\xe0garbage")
    for empty in ((0, 5), (5, 0), (0, 0)):  # libjpeg refuses a frame of no rows or columns
        with pytest.raises(jpeg.JpegError, match=r"^unreadable JPEG header: "):
            jpeg.read_header(samples.claims_pixels(*empty))


@pytest.mark.parametrize("size", [(1, 64), (64, 1)])
def test_a_one_pixel_strip_is_decoded_whole(size: tuple[int, int]) -> None:
    data = encode_jpeg(samples.small_photo(0).crop((0, 0, *size)))
    out = jpeg.decode_scaled(data, 224, max_scans=256, dc_only=True)
    assert out.shape == (size[1], size[0], 3)


def decode_at(data: bytes, height: int, width: int) -> np.ndarray:
    return simplejpeg.decode_jpeg(data, colorspace="RGB", min_height=height, min_width=width)


def test_dc_only_cut_is_decoded_at_one_eighth_only() -> None:
    # 640x480: 1/8 for a target of 60, 1/4 for 61
    cut = jpeg.walk(PROGRESSIVE, max_scans=256, dc_only_for=60).dc_only
    assert cut is not None
    full, dc = decode_at(PROGRESSIVE, 60, 80), decode_at(cut, 60, 80)
    assert not np.array_equal(full, dc)  # the two decodes really differ

    def scaled(target: int, dc_only: bool) -> np.ndarray:
        return jpeg.decode_scaled(PROGRESSIVE, target, max_scans=256, dc_only=dc_only)

    assert np.array_equal(scaled(60, dc_only=True), dc)
    assert np.array_equal(scaled(60, dc_only=False), full)
    assert np.array_equal(scaled(61, dc_only=True), decode_at(PROGRESSIVE, 120, 160))


def test_corrupt_stream_message() -> None:
    data = samples.truncated_jpeg()
    with pytest.raises(jpeg.JpegError, match=r"^corrupt or truncated JPEG: "):
        jpeg.decode_scaled(data, 224, max_scans=256, dc_only=True)


# --- the frame header alone: what admission prices a JPEG by ------------------------------------


def sof(marker: int, count: int, components: bytes, height: int = 16, width: int = 16) -> bytes:
    """A frame header: 8-bit samples, ``height`` x ``width``, ``count`` declared components."""
    size = height.to_bytes(2, "big") + width.to_bytes(2, "big")
    return segment(marker, b"\x08" + size + bytes([count]) + components)


Y = b"\x01\x11\x00"  # one component: id 1, 1x1 sampling, table 0
SOF9 = sof(0xC9, 1, Y)  # arithmetic-coded sequential


@pytest.mark.parametrize(
    ("stream", "expected"),
    [
        (SOI + COMMENT + SOF0 + sos(0) + EOI, jpeg.JpegFrame(16, 16, False, False)),
        (SOI + SOF2 + DC_SCAN + AC_SCAN + EOI, jpeg.JpegFrame(16, 16, True, False)),
        (SOI + SOF9 + sos(0) + EOI, jpeg.JpegFrame(16, 16, False, True)),
        # 0x0201 high byte first: 513 tall, 258 wide
        (SOI + sof(0xC0, 1, Y, 0x0201, 0x0102) + EOI, jpeg.JpegFrame(258, 513, False, False)),
    ],
    ids=["baseline", "progressive", "arithmetic", "big-endian-size"],
)  # fmt: skip
def test_frame_reads_size_and_coding(stream: bytes, expected: jpeg.JpegFrame) -> None:
    assert jpeg.frame(stream) == expected


def test_frame_of_a_real_photo() -> None:
    assert jpeg.frame(PROGRESSIVE) == jpeg.JpegFrame(640, 480, True, False)
    assert jpeg.frame(samples.compact(0)) == jpeg.JpegFrame(341, 256, False, False)


def test_frame_and_frame_layout_stop_at_the_frame_header() -> None:
    """Nothing after the frame header is read: its scans count against no limit (the walk with
    ``max_scans=1`` would refuse this file) and a broken segment after it goes unseen."""
    stream = SOI + SOF2 + DC_SCAN + AC_SCAN + b"\xff\xfe\x00\x01" + EOI
    with pytest.raises(jpeg.JpegError, match="more than 1 scans"):
        jpeg.walk(stream, max_scans=1)
    assert jpeg.frame(stream) == jpeg.JpegFrame(16, 16, True, False)
    layout = jpeg.frame_layout(stream)
    assert (layout.width, layout.height, layout.progressive) == (16, 16, True)
    assert (layout.scans, layout.dc_scans, layout.multi_scan, layout.dc_only) == (0, 0, False, None)


@pytest.mark.parametrize(
    "reader", [jpeg.frame, jpeg.frame_layout, lambda d: jpeg.walk(d, max_scans=8)]
)
def test_not_a_jpeg_message(reader) -> None:
    with pytest.raises(jpeg.JpegError, match=r"^not a JPEG: no start-of-image marker$"):
        reader(b"\x89PNG\r\n\x1a\n not a jpeg")


EMPTY, SAMPLING = "declares an empty image", "with impossible sampling factors"


@pytest.mark.parametrize(
    ("stream", "message"),
    [
        (SOI + sof(0xC0, 0, b""), r"^JPEG frame header with 0 components$"),  # ends at pos + 10
        (SOI + sof(0xC0, 2, b"\x01\x11\x00\x02\x11\x00"), r"^JPEG frame header with 2 components$"),
        (SOI + sof(0xC0, 3, Y) + EOI, r"^JPEG frame header with 3 components$"),
        (SOI + sof(0xC0, 1, Y, height=0) + EOI, f"^JPEG frame header {EMPTY}$"),
        (SOI + sof(0xC0, 1, Y, width=0) + EOI, f"^JPEG frame header {EMPTY}$"),
        (SOI + sof(0xC0, 1, b"\x01\x15\x00") + EOI, f"^JPEG frame header {SAMPLING}$"),
        (SOI + sof(0xC0, 1, b"\x01\x51\x00") + EOI, f"^JPEG frame header {SAMPLING}$"),
        (SOI + sof(0xC0, 1, b"\x01\x01\x00") + EOI, f"^JPEG frame header {SAMPLING}$"),
        (SOI + SOF0 + SOF0 + EOI, r"^JPEG with more than one frame \(hierarchical\)$"),
        (SOI + sof(0xC3, 1, Y) + EOI, r"^lossless and hierarchical JPEGs are not supported$"),
        (SOI + sos(0) + EOI, r"^JPEG scan before its frame header$"),
        (SOI + b"\xff\xfe\x00\x01" + SOF0, r"^JPEG segment with an impossible length$"),
    ],
    ids=["no-components", "two-components", "components-cut", "height-0", "width-0", "v-5",
         "h-5", "h-0", "two-frames", "lossless", "scan-first", "short-length"],
)  # fmt: skip
def test_frame_header_errors_name_the_fault(stream: bytes, message: str) -> None:
    with pytest.raises(jpeg.JpegError, match=message):
        jpeg.walk(stream, max_scans=8)


def test_sampling_factors_up_to_four_are_accepted() -> None:
    three = b"\x01\x44\x00\x02\x41\x00\x03\x14\x00"
    layout = jpeg.frame_layout(SOI + sof(0xC0, 3, three) + EOI)
    assert layout.sampling == ((4, 4), (4, 1), (1, 4))


@pytest.mark.parametrize("fields", [b"", b"\x08", b"\x08\x00\x10\x00\x10"])
def test_a_frame_header_too_short_for_its_fields_is_malformed_not_unsupported(
    fields: bytes,
) -> None:
    """Cut short (no component count; nothing at all, the last bytes of the file): malformed,
    a 422 naming it, not a claim about its sample precision read from the next segment's bytes
    (or an IndexError past the end)."""
    for data in (SOI + segment(0xC0, fields) + EOI, SOI + segment(0xC0, fields)):
        for read in (lambda d: jpeg.walk(d, max_scans=8), jpeg.frame, jpeg.frame_layout):
            with pytest.raises(jpeg.JpegError) as refused:
                read(data)
            assert type(refused.value) is jpeg.JpegError
            assert refused.value.args == (
                f"JPEG frame header cut short ({len(fields)} bytes; it needs 6)",
            )


def test_a_scan_header_shorter_than_its_components_is_malformed() -> None:
    three = sof(0xC0, 3, b"\x01\x11\x00\x02\x11\x00\x03\x11\x00")
    # Ns=3 but room for two component specs only (10 bytes: 2 short of pos + 8 + 2 * 3)
    scan = segment(0xDA, bytes([3, 1, 0x00, 2, 0x11, 0, 63, 0])) + b"\x12"
    with pytest.raises(jpeg.JpegError, match=r"^malformed JPEG scan header$"):
        jpeg.walk(SOI + three + scan + EOI, max_scans=8)


def test_a_segment_length_cut_by_the_end_ends_the_walk() -> None:
    layout = jpeg.walk(SOI + SOF0 + b"\xff\xfe\x00", max_scans=8)  # one length byte left
    assert (layout.width, layout.scans) == (16, 0)


def test_the_first_exif_app1_wins() -> None:
    first, second = b"Exif\x00\x00first", b"Exif\x00\x00second"
    xmp = segment(0xE1, b"http://ns.adobe.com/xap/1.0/\x00<x/>")
    stream = SOI + segment(0xE1, first) + xmp + segment(0xE1, second) + SOF0 + sos(0)
    start, end = jpeg.exif_segment(stream) or (0, 0)
    assert stream[start:end] == first


# --- the scale the decode runs at ----------------------------------------------------------------

#: 640x480, progressive: a target of 61 is 1/8 by the long side (80) but only 1/4 by the short
#: side (480 / 8 = 60 < 61), so the two modes decode differently.
LONG_ONLY = 61


def test_walk_cuts_by_the_short_side_unless_told_the_long_side() -> None:
    assert jpeg.walk(PROGRESSIVE, max_scans=256, dc_only_for=LONG_ONLY).dc_only is None
    layout = jpeg.walk(PROGRESSIVE, max_scans=256, dc_only_for=LONG_ONLY, long_side=True)
    assert layout.dc_only is not None


def test_decode_scales_by_the_short_side_unless_told_the_long_side() -> None:
    layout = jpeg.walk(PROGRESSIVE, max_scans=256)
    assert jpeg.decode(PROGRESSIVE, layout, LONG_ONLY).shape == (120, 160, 3)
    assert jpeg.decode(PROGRESSIVE, layout, LONG_ONLY, long_side=True).shape == (60, 80, 3)
    assert jpeg.decode(PROGRESSIVE, layout, LONG_ONLY, full_size=True).shape == (480, 640, 3)
    assert jpeg.decode(PROGRESSIVE, layout, LONG_ONLY, rgbx=True).shape == (120, 160, 4)


def test_decode_scaled_by_the_long_side_uses_the_dc_only_cut() -> None:
    cut = jpeg.walk(PROGRESSIVE, max_scans=256, dc_only_for=LONG_ONLY, long_side=True).dc_only
    assert cut is not None
    out = jpeg.decode_scaled(PROGRESSIVE, LONG_ONLY, max_scans=256, dc_only=True, long_side=True)
    assert np.array_equal(out, decode_at(cut, 60, 80))  # the cut, not the full stream at 1/8
    assert not np.array_equal(out, decode_at(PROGRESSIVE, 60, 80))


@pytest.mark.parametrize(("size", "shape"), [((4, 5), (2, 1, 3)), ((5, 4), (1, 2, 3))])
def test_decode_asks_libjpeg_for_the_rounded_up_size(
    size: tuple[int, int], shape: tuple[int, int, int]
) -> None:
    """4x5 for a target of 1 is 1/4 (4 // 4 = 1): 1x2, the odd side rounded up; a size rounded
    down would let libjpeg pick 1/8 (1x1)."""
    data = encode_jpeg(samples.small_photo(0).crop((0, 0, *size)))
    assert jpeg.decode(data, jpeg.walk(data, max_scans=8), 1).shape == shape


def _fresh(data: bytes, max_scans: int = 256) -> jpeg.JpegLayout:
    """The walk of ``data`` with nothing remembered (and nothing remembered after it)."""
    remembered, jpeg._recent = jpeg._recent, ()
    try:
        return jpeg.walk(data, max_scans=max_scans)
    finally:
        jpeg._recent = remembered


def _uploads(*seeds: int) -> list[bytes]:
    """What the SDK uploads to a 224-px model: the centre square (clip_gateway/client)."""
    square = CompactOptions().for_model(
        {"image_size": 224, "preprocessing": {"resize_mode": "shortest"}}
    )
    return [compact(encode_jpeg(samples.camera_photo(1600, 1200, seed=s)), square) for s in seeds]


def test_one_encoders_files_share_the_walk_of_their_header(monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = _uploads(1, 2)
    monkeypatch.setattr(jpeg, "_recent", ())
    end = first.index(b"\xff\xda")
    assert first[:end] == second[:end] and first[end + 20 :] != second[end + 20 :]
    layout = jpeg.walk(first, max_scans=256)
    assert [head for head, _ in jpeg._recent] == [first[: len(jpeg._recent[0][0])]]
    assert jpeg.walk(second, max_scans=256) is layout  # found, not walked
    assert layout == _fresh(second)
    assert jpeg.walk(second + b"trailing bytes", max_scans=256) is layout
    # the remembered header is not the decoder's limit: a file may not scan at all
    with pytest.raises(jpeg.JpegError, match="more than 0 scans"):
        jpeg.walk(second, max_scans=0)


_UPLOAD = _uploads(3)[0]


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_a_remembered_header_never_answers_for_another(data: st.DataObject) -> None:
    """Whatever byte of a file whose header is remembered is changed, cut or added, its walk
    is what a walk with nothing remembered says (the same layout, or the same error)."""
    before, jpeg._recent = jpeg._recent, ()  # after the upload was made (the client walks it)
    try:
        _compare_with_nothing_remembered(data)
    finally:
        jpeg._recent = before


def _compare_with_nothing_remembered(data: st.DataObject) -> None:
    base = _UPLOAD
    jpeg.walk(base, max_scans=256)
    assert jpeg._recent
    stream = bytearray(base)
    where = data.draw(st.integers(0, len(jpeg._recent[0][0]) + 8))
    action = data.draw(st.sampled_from(["flip", "cut", "insert"]))
    if action == "flip":
        stream[where] ^= data.draw(st.integers(1, 255))
    elif action == "cut":
        del stream[where:]
    else:
        stream[where:where] = data.draw(st.binary(min_size=1, max_size=4))
    mutated = bytes(stream)
    expected: object
    try:
        expected = _fresh(mutated)
    except jpeg.JpegError as exc:
        expected = (type(exc), str(exc))
    try:
        got: object = jpeg.walk(mutated, max_scans=256)
    except jpeg.JpegError as exc:
        got = (type(exc), str(exc))
    assert got == expected


def test_progressive_and_multi_scan_files_are_walked_every_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(jpeg, "_recent", ())
    progressive = encode_jpeg(samples.camera_photo(64, 48, seed=4), progressive=True)
    assert jpeg.walk(progressive, max_scans=256).scans > 1
    assert jpeg._recent == ()
