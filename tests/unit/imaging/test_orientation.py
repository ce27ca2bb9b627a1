"""EXIF orientation read from each container by signature, and the TIFF walk's own bounds."""

from __future__ import annotations

import struct
from io import BytesIO

import pytest
from PIL import Image

from clip_gateway.imaging import orientation
from tests import samples


def saved(fmt: str, value: int | None, size: tuple[int, int] = (24, 16)) -> bytes:
    """A small image in ``fmt`` written by Pillow, with EXIF orientation ``value`` (or none)."""
    image = Image.new("RGB", size, (200, 30, 90))
    if value is None:
        return samples.encode(image, fmt)
    exif = Image.Exif()
    exif[orientation.TAG] = value
    return samples.encode(image, fmt, exif=exif.tobytes())


def tiff(value: int, *, big_endian: bool = False, before: int = 0) -> bytes:
    """A TIFF-structured EXIF block: ``before`` other entries, then the orientation."""
    order = ">" if big_endian else "<"
    entries = [struct.pack(order + "HHII", 0x010F, 2, 4, 0)] * before
    entries.append(struct.pack(order + "HHIHH", orientation.TAG, 3, 1, value, 0))
    head = (b"MM\x00*" if big_endian else b"II*\x00") + struct.pack(order + "I", 8)
    return head + struct.pack(order + "H", len(entries)) + b"".join(entries)


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
@pytest.mark.parametrize("value", [3, 6, 8])
def test_each_container_gives_its_orientation(fmt: str, value: int) -> None:
    data = saved(fmt, value)
    assert orientation.of(data) == value
    assert Image.open(BytesIO(data)).getexif()[orientation.TAG] == value  # Pillow agrees


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP", "GIF", "BMP"])
def test_without_exif_or_from_other_formats_it_is_upright(fmt: str) -> None:
    assert orientation.of(saved(fmt, None)) == 1


def test_signatures_are_matched_exactly() -> None:
    webp = saved("WEBP", 6)
    assert orientation.of(b"RIFX" + webp[4:]) == 1  # RIFF, not any RIFF-like start
    assert orientation.of(webp[:8] + b"WAVE" + webp[12:]) == 1  # a RIFF that is not WebP
    assert orientation.of(b"\x89PNX" + saved("PNG", 6)[4:]) == 1
    assert orientation.of(b"\xff\xd9" + saved("JPEG", 6)[2:]) == 1


@pytest.mark.parametrize("fmt", ["PNG", "WEBP"])
def test_a_broken_container_is_upright_not_an_error(fmt: str) -> None:
    data = saved(fmt, 6)
    assert orientation.of(data[:20]) == 1  # cut inside the first chunk


@pytest.mark.parametrize("big_endian", [False, True])
def test_the_tiff_block_in_either_byte_order(big_endian: bool) -> None:
    assert orientation.from_tiff(tiff(6, big_endian=big_endian)) == 6
    assert orientation.from_tiff(b"Exif\x00\x00" + tiff(6, big_endian=big_endian)) == 6


def test_a_block_inside_a_larger_buffer_is_read_between_its_bounds() -> None:
    block = b"Exif\x00\x00" + tiff(7, before=2)
    data = b"\xaa" * 10 + block + b"\xbb" * 30
    assert orientation.from_tiff(data, 10, 10 + len(block)) == 7
    assert orientation.from_tiff(data, 10, 10**9) == 7  # an end past the buffer is clamped
    assert orientation.from_tiff(data, 16, 10 + len(block)) == 7  # without the Exif header
    # the orientation entry is the last 12 bytes: an end that cuts it leaves it unread
    assert orientation.from_tiff(data, 10, 10 + len(block) - 1) == 1
    assert orientation.from_tiff(data, 10, 10 + len(block) - 12) == 1


def test_a_truncated_header_is_upright() -> None:
    data = b"\x00" * 10 + b"II*\x00\x08\x00"  # a TIFF header cut short, inside a buffer
    assert orientation.from_tiff(data, 10) == 1
    assert orientation.from_tiff(b"Exif\x00\x00II*\x00") == 1


@pytest.mark.parametrize(
    ("block", "expected"),
    [
        (tiff(6)[:2] + b"\x2b\x00" + tiff(6)[4:], 1),  # not 42: not TIFF
        (b"XX" + tiff(6)[2:], 1),  # neither byte order
        (tiff(6)[:4] + struct.pack("<I", 1000) + tiff(6)[8:], 1),  # IFD beyond the block
        (tiff(0), 1),
        (tiff(9), 1),
        (tiff(1), 1),
        (tiff(8), 8),
        (tiff(6).replace(b"\x12\x01\x03\x00", b"\x12\x01\x04\x00"), 1),  # LONG, not SHORT
        (tiff(6).replace(b"\x03\x00\x01\x00\x00\x00", b"\x03\x00\x02\x00\x00\x00"), 1),  # 2 values
    ],
    ids=["not-42", "no-byte-order", "ifd-beyond", "0", "9", "1", "8", "long", "two-values"],
)
def test_malformed_or_out_of_range_orientations_are_upright(block: bytes, expected: int) -> None:
    assert orientation.from_tiff(block) == expected


def test_ifd_offsets_past_the_block_or_the_signed_range_are_upright() -> None:
    block = tiff(6)
    at_end = block[:4] + struct.pack("<I", len(block)) + block[8:]  # the IFD would start at end
    assert orientation.from_tiff(at_end) == 1
    huge = block[:4] + struct.pack("<I", 0xFFFF_FFF0) + block[8:]  # negative if read signed
    assert orientation.from_tiff(huge) == 1


def test_only_the_entries_the_ifd_declares_are_read() -> None:
    """IFD0 declares one entry (the maker); an orientation entry right after it (the next IFD's
    pointer and value area in a real file) is not IFD0's."""
    maker = struct.pack("<HHII", 0x010F, 2, 4, 0)
    stray = struct.pack("<HHIHH", orientation.TAG, 3, 1, 6, 0)
    block = b"II*\x00" + struct.pack("<I", 8) + struct.pack("<H", 1) + maker + stray
    assert orientation.from_tiff(block) == 1
    declared = b"II*\x00" + struct.pack("<I", 8) + struct.pack("<H", 2) + maker + stray
    assert orientation.from_tiff(declared) == 6


def test_an_entry_count_over_32767_is_a_large_count_not_a_negative_one() -> None:
    block = tiff(6)
    many = block[:8] + struct.pack("<H", 0x8001) + block[10:]  # capped by what the block holds
    assert orientation.from_tiff(many) == 6


def test_exif_after_the_first_scan_is_not_read_as_pillow_does_not() -> None:
    """A progressive JPEG with an Exif APP1 between its scans: Pillow reads the segments before
    the first scan only, so its reference transform does not turn the image; neither does the
    gateway, whichever walk reads the Exif (``orientation.of``, or the decode's own walk)."""
    from clip_gateway.imaging import jpeg

    plain = samples.encode(Image.new("RGB", (64, 48), (10, 120, 200)), "JPEG", progressive=True)
    exif = Image.Exif()
    exif[orientation.TAG] = 6
    app1 = exif.tobytes()  # "Exif\0\0" and the TIFF block
    segment = b"\xff\xe1" + (len(app1) + 2).to_bytes(2, "big") + app1
    first_scan = plain.index(b"\xff\xda")
    second_scan = plain.index(b"\xff\xda", first_scan + 2)
    between = plain[:second_scan] + segment + plain[second_scan:]
    before = plain[:first_scan] + segment + plain[first_scan:]

    assert Image.open(BytesIO(between)).getexif().get(orientation.TAG) is None
    assert orientation.of(between) == 1
    assert jpeg.walk(between, max_scans=64).exif is None
    # the same segment before the first scan is read, by Pillow and by both walks
    assert Image.open(BytesIO(before)).getexif()[orientation.TAG] == 6
    assert orientation.of(before) == 6
    assert jpeg.walk(before, max_scans=64).exif == (first_scan + 4, first_scan + len(segment))
