"""Telling photos by their first bytes, and opening the formats the gateway does not read."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from clip_gateway.client import CompactOptions, compact
from clip_gateway.client.formats import HEAD_BYTES, UnreadableImage, identify, open_image
from clip_gateway.imaging.preprocess import sniff
from tests import samples


def heic(image: Image.Image) -> bytes:
    from pillow_heif import register_heif_opener

    register_heif_opener()
    return samples.encode(image, "HEIF", quality=70)


def ftyp(major: bytes, *compatible: bytes) -> bytes:
    body = major + b"\x00\x00\x00\x00" + b"".join(compatible)
    return (8 + len(body)).to_bytes(4, "big") + b"ftyp" + body


@pytest.mark.parametrize(
    ("head", "kind"),
    [
        (samples.compact(0)[:64], "jpeg"),
        (samples.png(0)[:64], "png"),
        (samples.webp(0)[:64], "webp"),
        (samples.gif(0)[:64], "gif"),
        (ftyp(b"heic", b"mif1", b"heic"), "heif"),
        (ftyp(b"mif1", b"heic"), "heif"),
        (ftyp(b"avif", b"mif1", b"miaf"), "avif"),
        (ftyp(b"mif1", b"miaf", b"avif"), "avif"),  # the codec told by a compatible brand
        (ftyp(b"isom", b"mp42"), None),  # a video
        (ftyp(b"mif1"), "heif"),  # the HEIF container; libheif finds the codec
        (b"RIFF\x00\x00\x00\x00WAVEfmt ", None),
        (b"II*\x00", None),  # TIFF and the RAW formats built on it
        (b"shopping list", None),
        (b"", None),
    ],
)
def test_identify(head: bytes, kind: str | None) -> None:
    assert identify(head) == kind


def test_identify_reads_only_the_head_whatever_the_box_claims() -> None:
    # an ftyp box claiming 4 GiB of compatible brands: only HEAD_BYTES are read
    huge = (0xFFFFFFFF).to_bytes(4, "big") + b"ftypisom" + bytes(4) + b"mp42" * 1_000_000
    assert identify(huge) is None
    assert identify(huge[:64] + b"avif") is None  # the brand past HEAD_BYTES is never read
    assert identify(huge[:60] + b"avif") == "avif"


@pytest.mark.parametrize(
    "data",
    [samples.compact(0), samples.png(0), samples.webp(0), samples.gif(0)],
    ids=["jpeg", "png", "webp", "gif"],
)
def test_client_and_server_tell_formats_alike(data: bytes) -> None:
    """The server's ``sniff`` and the client's ``identify`` read the one signature table."""
    assert sniff(data) == identify(data[:HEAD_BYTES]) == identify(data)


def test_heic_is_opened_and_converted_to_a_compact_jpeg() -> None:
    data = heic(samples.small_photo(1, (512, 384)))  # x265 encodes it: larger costs seconds
    assert identify(data[:64]) == "heif"
    with open_image(data, "heif") as image:
        assert image.size == (512, 384)
    small = compact(data)
    assert small.startswith(b"\xff\xd8") and Image.open(io.BytesIO(small)).size == (298, 224)


def test_gif_sends_its_first_frame_and_is_converted_even_when_small() -> None:
    red, blue = Image.new("RGB", (40, 30), (255, 0, 0)), Image.new("RGB", (40, 30), (0, 0, 255))
    data = samples.encode(red, "GIF", save_all=True, append_images=[blue])
    sent = Image.open(io.BytesIO(compact(data))).convert("RGB")
    assert sent.size == (40, 30)  # smaller than the shrink size: kept
    r, _, b = sent.getpixel((20, 15))
    assert r > 200 and b < 60  # the first frame, not the second
    unshrunk = compact(data, CompactOptions(enabled=False))
    assert unshrunk.startswith(b"\xff\xd8")  # the gateway reads no GIF: converted all the same


def test_a_heic_header_with_nothing_behind_it_is_named_without_pillows_buffer() -> None:
    # a file whose brand says HEIC and holds nothing Pillow can identify: the reason a user
    # reads names the file's kind, not "cannot identify image file <_io.BytesIO object at 0x…>"
    with pytest.raises(UnreadableImage) as raised:
        compact(b"\x00\x00\x00\x18ftypheic" + b"\x00" * 100)
    assert str(raised.value) == "damaged or not a HEIF file"


def test_a_truncated_heic_is_unreadable_with_the_reason() -> None:
    data = heic(samples.small_photo(2))
    with pytest.raises(UnreadableImage, match="corrupt or truncated HEIF"):
        compact(data[: len(data) // 2])
