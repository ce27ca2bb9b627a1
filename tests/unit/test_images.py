"""Bytes to the model's input: formats, limits, orientation, and agreement with open_clip's way."""

from __future__ import annotations

import io
import zlib

import numpy as np
import pytest
from PIL import Image, ImageOps

from gateway.errors import ImageTooLarge, InvalidImage, LimitExceeded, UnsupportedFormat
from gateway.imaging import preprocess as images
from tests import samples

OPTIONS = images.ImageOptions(size=224, max_pixels=40_000_000, max_bytes=16 << 20)


def run(data: bytes, options: images.ImageOptions = OPTIONS) -> np.ndarray:
    out = np.zeros((224, 224, 3), np.uint8)
    images.preprocess(data, out, options)
    return out


def reference(data: bytes) -> np.ndarray:
    """open_clip's way: full decode, EXIF-upright, short side to 224 (bicubic), centre crop."""
    image = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")
    w, h = image.size
    scale = 224 / min(w, h)
    resized = image.resize(
        (max(224, round(w * scale)), max(224, round(h * scale))), Image.Resampling.BICUBIC
    )
    left, top = (resized.width - 224) // 2, (resized.height - 224) // 2
    return np.asarray(resized.crop((left, top, left + 224, top + 224)))


def mean_abs(a: np.ndarray, b: np.ndarray) -> float:
    """Mean absolute difference of 4x4-pooled images: blind to the sub-pixel offsets that
    different crop rounding gives on noisy textures, not to anything visible."""

    def pool(x: np.ndarray) -> np.ndarray:
        return x.astype(np.float64).reshape(56, 4, 56, 4, 3).mean(axis=(1, 3))

    return float(np.abs(pool(a) - pool(b)).mean())


@pytest.mark.parametrize(
    ("data", "kind"),
    [(samples.compact(0), "jpeg"), (samples.png(0), "png"), (samples.webp(0), "webp")],
)
def test_sniff_supported(data: bytes, kind: str) -> None:
    assert images.sniff(data) == kind


@pytest.mark.parametrize(
    "data",
    [
        samples.gif(),
        b"BM" + b"\x00" * 50,
        b"II*\x00" + b"\x00" * 20,
        b"\x00\x00\x00\x18ftypheic" + b"\x00" * 20,
    ],
    ids=["gif", "bmp", "tiff", "heic"],
)
def test_known_but_unsupported_formats_are_415(data: bytes) -> None:
    with pytest.raises(UnsupportedFormat):
        images.sniff(data)


def test_unknown_bytes_are_not_an_image() -> None:
    with pytest.raises(InvalidImage, match="not an image"):
        images.sniff(b"PK\x03\x04 a zip file")


@pytest.mark.parametrize(
    "data",
    [samples.compact(1), samples.progressive_jpeg(2), samples.png(3), samples.webp(4)],
    ids=["compact", "progressive-4mp", "png", "webp"],
)
def test_close_to_open_clip_preprocessing(data: bytes) -> None:
    assert mean_abs(run(data), reference(data)) < 2.5


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_is_applied(orientation: int) -> None:
    data = samples.oriented_jpeg(orientation)
    assert mean_abs(run(data), reference(data)) < 2.5
    if orientation > 1:  # and it really changed something
        assert mean_abs(run(data), run(samples.oriented_jpeg(1))) > 5


def test_grayscale_and_cmyk_become_rgb() -> None:
    gray = run(samples.grayscale_jpeg(0))
    assert np.array_equal(gray[..., 0], gray[..., 1])
    cmyk = run(samples.cmyk_jpeg(0))
    assert mean_abs(cmyk, reference(samples.encode(samples.small_photo(0), "PNG"))) < 6


def test_small_images_are_upscaled() -> None:
    tiny = samples.encode(samples.small_photo(0).resize((64, 48)), "JPEG")
    out = run(tiny)
    assert out.std() > 5


def test_header_pixel_limit_comes_before_decoding() -> None:
    with pytest.raises(ImageTooLarge, match="60000x60000"):
        run(samples.claims_pixels(60000, 60000))
    png = bytearray(samples.png(0))
    png[16:24] = (100_000).to_bytes(4, "big") * 2  # IHDR width/height, then its CRC
    png[29:33] = zlib.crc32(bytes(png[12:29])).to_bytes(4, "big")
    with pytest.raises(ImageTooLarge):
        run(bytes(png))


def test_byte_limit() -> None:
    with pytest.raises(LimitExceeded):
        run(samples.compact(0), images.ImageOptions(224, 10**8, max_bytes=1000))


@pytest.mark.parametrize(
    "data",
    [
        b"",
        samples.truncated_jpeg(),
        samples.corrupt_jpeg(),
        samples.png(0)[:200],
        samples.webp(0)[:100],
    ],
    ids=["empty", "truncated", "corrupt", "png-truncated", "webp-truncated"],
)
def test_broken_images_are_invalid(data: bytes) -> None:
    with pytest.raises(InvalidImage):
        run(data)
