"""What preprocessing pays before it pays it: the DCT scale each resize mode decodes at, the
decoder memory it estimates from the header, and the JPEG block-visit cap, each at its exact
boundary. The expected figures are worked out here from the formats (libjpeg's 4:2:0 blocks,
its 10-scan progressive script, Pillow's buffers), not read back from the code under test."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
from PIL import Image

from clip_gateway.errors import ImageTooLarge, InvalidImage
from clip_gateway.imaging import preprocess as images
from tests import samples

MiB = 1 << 20
W, H = 4000, 1000  # a wide photo: its short side is 1000, its long side 4000


def jpeg(progressive: bool) -> bytes:
    image = Image.new("RGB", (W, H), (120, 60, 30))
    return samples.encode(image, "JPEG", quality=80, progressive=progressive)


BASELINE, PROGRESSIVE = jpeg(False), jpeg(True)
#: 4:2:0 in 8x8 blocks: Y 500 x 125, Cb and Cr 250 x 63 (1000/2 = 500 rows -> 63 blocks)
BLOCKS = 500 * 125 + 2 * 250 * 63
SCANS, DC_SCANS = 10, 2  # libjpeg's default progressive script for YCbCr
#: The decoders' own working memory (tables, row buffers), on top of the image buffers.
OVERHEAD = MiB


def options(mode: images.ResizeMode = "shortest", **kw: int) -> images.DecodeOptions:
    base = {"size": 224, "max_pixels": 50_000_000, "max_bytes": 64 * MiB}
    return images.DecodeOptions(resize_mode=mode, **{**base, **kw})  # type: ignore[arg-type]


def run(data: bytes, opts: images.DecodeOptions) -> images.Decoded:
    return images.preprocess(data, np.empty((opts.size, opts.size, 3), np.uint8), opts)


@pytest.mark.parametrize(
    ("mode", "pixels"),
    [
        ("shortest", 1000 * 250),  # 1/4: the short side 250 >= 224 (1/8 would be 125)
        ("squash", 1000 * 250),  # squash needs both sides, so the short one decides too
        ("longest", 500 * 125),  # 1/8: the long side 500 >= 224 is all a fit-inside needs
    ],
)
@pytest.mark.parametrize("progressive", [False, True])
def test_each_mode_decodes_at_the_scale_its_side_needs(
    mode: images.ResizeMode, pixels: int, progressive: bool
) -> None:
    decoded = run(PROGRESSIVE if progressive else BASELINE, options(mode))
    assert (decoded.format, decoded.width, decoded.height) == ("jpeg", W, H)
    assert decoded.decoded_pixels == pixels


@pytest.mark.parametrize(("mode", "pixels"), [("shortest", 1000 * 250), ("longest", 500 * 125)])
def test_a_baseline_jpeg_costs_its_scaled_rgbx_output_and_no_coefficients(
    mode: images.ResizeMode, pixels: int
) -> None:
    peak = pixels * 4 + OVERHEAD  # the RGBX array at the scale this mode decodes at
    run(BASELINE, options(mode, max_decode_bytes=peak))  # exactly the budget
    with pytest.raises(ImageTooLarge) as refused:
        run(BASELINE, options(mode, max_decode_bytes=peak - 1))
    assert refused.value.extra == {"limit": peak - 1, "width": W, "height": H}


def test_an_unsupported_jpeg_is_refused_with_the_walkers_reason() -> None:
    from clip_gateway.errors import UnsupportedFormat

    frame = BASELINE.index(b"\xff\xc0")
    twelve_bit = BASELINE[: frame + 4] + b"\x0c" + BASELINE[frame + 5 :]
    with pytest.raises(UnsupportedFormat) as refused:
        run(twelve_bit, options())
    assert refused.value.reason == "12-bit JPEG samples are not supported (only 8)"


def test_a_progressive_jpeg_also_costs_its_whole_coefficient_buffer() -> None:
    # 64 int16 per block, plus the 1/4-scale RGBX
    peak = BLOCKS * 64 * 2 + 1000 * 250 * 4 + OVERHEAD
    run(PROGRESSIVE, options(max_decode_bytes=peak))
    with pytest.raises(ImageTooLarge) as refused:
        run(PROGRESSIVE, options(max_decode_bytes=12 * MiB))
    assert refused.value.reason == (
        f"image is {W}x{H}: decoding it needs about {math.ceil(peak / MiB)} MiB, over the "
        "12 MiB budget per image"
    )
    assert refused.value.extra == {"limit": 12 * MiB, "width": W, "height": H}


def test_the_block_visit_cap_counts_the_scans_that_will_be_decoded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # shortest: 1/8 would be too small, so every scan is decoded
    monkeypatch.setattr(images, "MAX_BLOCK_VISITS", BLOCKS * SCANS)
    run(PROGRESSIVE, options())  # exactly at the cap
    monkeypatch.setattr(images, "MAX_BLOCK_VISITS", BLOCKS * SCANS - 1)
    with pytest.raises(ImageTooLarge) as refused:
        run(PROGRESSIVE, options())
    assert refused.value.reason == (
        f"image is {W}x{H} with {SCANS} scans: decoding it would visit {BLOCKS * SCANS} "
        f"blocks, over the limit of {BLOCKS * SCANS - 1}"
    )
    assert refused.value.extra == {"width": W, "height": H}
    # longest: 1/8 is enough, and the DC scans alone are decoded
    monkeypatch.setattr(images, "MAX_BLOCK_VISITS", BLOCKS * DC_SCANS)
    run(PROGRESSIVE, options("longest"))
    monkeypatch.setattr(images, "MAX_BLOCK_VISITS", BLOCKS * DC_SCANS - 1)
    with pytest.raises(ImageTooLarge):
        run(PROGRESSIVE, options("longest"))


def test_a_single_scan_is_never_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    """One scan visits each block once: within the pixel limit it is always far below the cap,
    so it is not checked at all."""
    monkeypatch.setattr(images, "MAX_BLOCK_VISITS", 1)
    assert run(BASELINE, options()).decoded_pixels == 1000 * 250


@pytest.mark.parametrize(
    ("fmt", "mode", "per_pixel"),
    [
        ("PNG", "RGB", 4),  # Pillow's RGBX buffer is already RGB: no copy
        ("PNG", "RGBA", 8),  # RGBA, then its RGB copy
        ("PNG", "L", 5),  # one byte, then the RGB copy
        ("WEBP", "RGB", 16),  # libwebp's RGBA, Pillow's bytes and image, the RGB copy
        ("GIF", "RGB", 5),  # the palette image and its RGB copy
    ],
)
def test_pillow_formats_cost_their_full_size_buffers_and_rgb_copy(
    fmt: str, mode: str, per_pixel: int
) -> None:
    data = samples.encode(Image.new(mode, (300, 200), 90), fmt)
    peak = 300 * 200 * per_pixel + OVERHEAD
    assert run(data, options(max_decode_bytes=peak)).decoded_pixels == 300 * 200
    with pytest.raises(ImageTooLarge) as refused:
        run(data, options(max_decode_bytes=peak - 1))
    assert refused.value.extra == {"limit": peak - 1, "width": 300, "height": 200}


def png_header(width: int, height: int, crc_ok: bool = True) -> bytes:
    ihdr = b"IHDR" + width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 2, 0, 0, 0])
    crc = zlib.crc32(ihdr) ^ (0 if crc_ok else 1)
    chunk = (13).to_bytes(4, "big") + ihdr + crc.to_bytes(4, "big")
    idat = b"IDAT" + zlib.compress(b"\x00" * 10)
    end = b"IEND"
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk
        + (len(idat) - 4).to_bytes(4, "big") + idat + zlib.crc32(idat).to_bytes(4, "big")
        + (0).to_bytes(4, "big") + end + zlib.crc32(end).to_bytes(4, "big")
    )  # fmt: skip


def test_pillows_own_bomb_guard_is_a_too_large_image_when_the_budgets_allow_more() -> None:
    """An operator who raised the budgets past Pillow's guard (2 x 89 M pixels) still gets a
    413-class refusal with Pillow's reason, not a 500."""
    huge = options(max_pixels=1 << 40, max_decode_bytes=1 << 50)
    with pytest.raises(ImageTooLarge, match="decompression bomb"):
        run(png_header(20_000, 10_000), huge)


def test_a_header_pillow_refuses_is_an_invalid_image_naming_the_format() -> None:
    with pytest.raises(InvalidImage) as refused:
        run(png_header(300, 200, crc_ok=False), options())  # a broken IHDR checksum
    assert refused.value.reason == "cannot read png header: damaged or not a png file"
