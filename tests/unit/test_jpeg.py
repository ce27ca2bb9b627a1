"""DCT-scaled JPEG decoding and the AC-scan cut for progressive files."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import simplejpeg
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.photos import jpeg as encode_jpeg
from bench.photos import photo
from gateway.imaging import jpeg
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
    data = encode_jpeg(photo(*size, seed=1))
    header = jpeg.read_header(data)
    assert (header.width, header.height) == size
    out = jpeg.decode_scaled(data, header, 224, max_scans=256, dc_only=True)
    assert out.shape == expected_shape  # 341x256 is decoded whole, not at the slow 7/8 scale


def test_baseline_needs_no_cut() -> None:
    info = jpeg.inspect_scans(samples.compact(0), max_scans=256, want_dc_only=True)
    assert (info.progressive, info.scans, info.dc_only) == (False, 1, None)


def test_progressive_cut_keeps_only_dc_scans_and_stays_close() -> None:
    data = samples.progressive_jpeg(3)
    info = jpeg.inspect_scans(data, max_scans=256, want_dc_only=True)
    assert info.progressive and info.scans >= 6
    assert info.dc_only is not None and len(info.dc_only) < len(data) / 5
    full = simplejpeg.decode_jpeg(data, min_height=225, min_width=300)
    cut = simplejpeg.decode_jpeg(info.dc_only, min_height=225, min_width=300)
    assert full.shape == cut.shape == (225, 300, 3)
    assert np.abs(full.astype(int) - cut).mean() < 2.0


def test_scan_limit_refuses_deeply_progressive_files() -> None:
    with pytest.raises(jpeg.JpegError, match="more than 3 scans"):
        jpeg.inspect_scans(samples.progressive_jpeg(3), max_scans=3, want_dc_only=False)


def test_unreadable_header() -> None:
    with pytest.raises(jpeg.JpegError):
        jpeg.read_header(b"\xff\xd8\xff\xe0garbage")


PROGRESSIVE = samples.progressive_jpeg(5, (640, 480))


def test_stream_cut_inside_a_scan_header() -> None:
    sos = PROGRESSIVE.index(b"\xff\xda")
    for end in range(sos, sos + 16):  # found by the fuzz test below
        jpeg.inspect_scans(PROGRESSIVE[:end], max_scans=64, want_dc_only=True)


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
        jpeg.inspect_scans(bytes(stream), max_scans=64, want_dc_only=True)


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
