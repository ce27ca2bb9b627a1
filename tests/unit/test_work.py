"""Decode work priced from headers (imaging/work.py): format, coding and pixels read before
anything is decoded; prices worked out here from the factors' meaning (pixels x per-pixel +
bytes x per-byte), never from a decode."""

from __future__ import annotations

import base64
import struct
import zlib

import pytest
from PIL import Image

from clip_gateway.imaging import work
from clip_gateway.pipeline.items import ImageItem, price
from tests import hostile, samples


def flat(size: tuple[int, int], mode: str = "RGB") -> Image.Image:
    return Image.new(mode, size, 90)


@pytest.mark.parametrize(
    ("data", "coding", "pixels"),
    [
        (samples.encode(flat((640, 480)), "JPEG"), "jpeg-baseline", 640 * 480),
        (samples.encode(flat((640, 480)), "JPEG", progressive=True), "jpeg-progressive", 640 * 480),
        (hostile.jpeg_arithmetic(), "jpeg-arithmetic", 10_000 * 10_000),
        (samples.encode(flat((300, 200)), "PNG"), "png", 300 * 200),
        (samples.encode(flat((300, 200), "I;16"), "PNG"), "png-16bit", 300 * 200),
        (samples.encode(flat((300, 200)), "WEBP", quality=80), "webp-lossy", 300 * 200),
        (hostile.webp_flat_lossless(), "webp-lossless", 3800 * 3800),
        (samples.encode(flat((300, 200)), "GIF"), "gif", 300 * 200),
    ],
    ids=["baseline", "progressive", "arithmetic", "png", "png16", "lossy", "lossless", "gif"],
)
def test_each_format_and_coding_is_priced_by_its_pixels_and_bytes(
    data: bytes, coding: str, pixels: int
) -> None:
    per_pixel, per_byte = work.FACTORS[coding]
    priced = work.estimate(data)
    assert priced == work.Work(
        coding.split("-")[0], coding, per_pixel * pixels + per_byte * len(data)
    )


def test_an_interlaced_png_is_priced_as_interlaced() -> None:
    png = bytearray(samples.png(0))
    png[28] = 1  # IHDR's interlace method: Adam7
    png[29:33] = struct.pack(">I", zlib.crc32(bytes(png[12:29])))
    assert work.estimate(bytes(png)).coding == "png-interlaced"


def test_a_few_hundred_bytes_that_decode_to_megapixels_cost_their_decode() -> None:
    """The issue's attack: bytes-priced, a 600-byte WebP was free; work-priced, ~0.13 s."""
    tiny = hostile.webp_flat_lossless()
    assert len(tiny) < 1000
    assert work.estimate(tiny).seconds > 0.1


@pytest.mark.parametrize(
    "data",
    [b"", b"not an image", samples.bmp(0), b"\xff\xd8\xff\xe0\x00\x10JFIF", b"\x89PNG\r\n\x1a\n"],
    ids=["empty", "junk", "bmp", "jpeg-without-frame", "png-without-ihdr"],
)
def test_what_the_decoder_refuses_at_once_costs_nothing_beyond_the_item(data: bytes) -> None:
    assert work.estimate(data) == work.REFUSED


def test_a_base64_item_is_priced_from_its_header_like_its_bytes() -> None:
    data = samples.encode(flat((640, 480)), "PNG")
    encoded = base64.b64encode(data).decode()
    assert price(ImageItem(data)) == work.estimate(data)
    assert price(ImageItem.encoded(encoded)).coding == "png"
    assert price(ImageItem.encoded("DATA:IMAGE/PNG;BASE64," + encoded)).coding == "png"
    wrapped = base64.encodebytes(data).decode()  # MIME line breaks
    assert price(ImageItem.encoded(wrapped)).coding == "png"
    assert price(ImageItem.encoded("%%% not base64")) == work.REFUSED


def test_a_large_base64_item_is_priced_from_its_first_mebibyte() -> None:
    """Its bytes beyond the prefix still count at the per-byte factor (the whole length)."""
    data = samples.encode(flat((640, 480)), "JPEG") + b"\x00" * (3 << 20)  # trailing junk
    encoded = base64.b64encode(data).decode()
    priced = price(ImageItem.encoded(encoded))
    per_pixel, per_byte = work.FACTORS["jpeg-baseline"]
    assert priced.seconds == pytest.approx(
        per_pixel * 640 * 480 + per_byte * (len(encoded) * 3 // 4)
    )


def test_a_base64_jpeg_whose_frame_is_beyond_the_prefix_is_priced_at_the_worst() -> None:
    """Padding before the frame header cannot make an image free: a real file never puts a
    mebibyte before its frame, so it is priced at the pixel limit, progressive."""
    jpeg = samples.encode(flat((64, 64)), "JPEG")
    comment = b"\xff\xfe\xff\xf0" + b"x" * 0xFFEE  # a 64 KiB COM segment
    padded = jpeg[:2] + comment * 20 + jpeg[2:]
    priced = price(ImageItem.encoded(base64.b64encode(padded).decode()))
    assert priced.coding == "jpeg-progressive"
    assert priced.seconds >= work.FACTORS["jpeg-progressive"][0] * work.WORST_PIXELS
    assert work.estimate(padded).coding == "jpeg-baseline"  # the whole bytes: its real price
