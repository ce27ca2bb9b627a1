"""Every resize mode and interpolation against open_clip's own inference transform
(``image_transform_v2`` with mean 0 / std 1, so its tensor is the pixels /255): the geometry
(sizes, rounding, crop and pad offsets, EXIF orientation) must match to the pixel.

PNGs are decoded at full size, so only Pillow's rounding may differ (a level or two, rarely). JPEGs
are decoded DCT-scaled (imaging/jpeg.py), a small difference of its own; with EXIF orientation the
resize runs on the stored image before turning it, so its two 8-bit passes round in the other order.
A geometry error (a pixel's shift, the wrong mode) costs several levels on average."""

from __future__ import annotations

import io

import numpy as np
import pytest
from open_clip.transform import PreprocessCfg, image_transform_v2
from PIL import Image, ImageOps

from clip_gateway.imaging.preprocess import DecodeOptions, Interpolation, ResizeMode, preprocess
from tests import samples
from tests.reference import unit

MODES: tuple[ResizeMode, ...] = ("shortest", "longest", "squash")
INTERPOLATIONS: tuple[Interpolation, ...] = ("bicubic", "bilinear")
#: Below the mean absolute difference a one-pixel shift costs on these photos (measured 2.96 to
#: 7.6 levels; 3.3-4.0 before the crop offsets followed torchvision's rounding).
SHIFT = 2.5


def reference(data: bytes, size: int, mode: str, interpolation: str, fill: int) -> np.ndarray:
    cfg = PreprocessCfg(size=size, mean=(0.0,) * 3, std=(1.0,) * 3, interpolation=interpolation,
                        resize_mode=mode, fill_color=fill)  # fmt: skip
    transform = image_transform_v2(cfg, is_train=False)
    image = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")
    return np.asarray(transform(image).permute(1, 2, 0).numpy() * 255.0, dtype=np.float64)


def gateway(
    data: bytes, size: int, mode: ResizeMode, interpolation: Interpolation, fill: int = 0
) -> np.ndarray:
    out = np.empty((size, size, 3), np.uint8)
    options = DecodeOptions(size=size, max_pixels=1 << 30, max_bytes=1 << 30, resize_mode=mode,
                           interpolation=interpolation, fill_color=(fill,) * 3)  # fmt: skip
    preprocess(data, out, options)
    return out.astype(np.float64)


PNGS = {
    "wide": samples.encode(samples.small_photo(1, (640, 300)), "PNG"),
    "tall": samples.encode(samples.small_photo(2, (300, 641)), "PNG"),
    "square": samples.encode(samples.small_photo(3, (500, 500)), "PNG"),
    "small": samples.encode(samples.small_photo(4, (150, 90)), "PNG"),  # upsampled
}


@pytest.mark.parametrize("size", [224, 256, 384])
@pytest.mark.parametrize("interpolation", INTERPOLATIONS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(PNGS))
def test_full_size_decodes_match_open_clip_to_rounding(
    name: str, mode: ResizeMode, interpolation: Interpolation, size: int
) -> None:
    expected = reference(PNGS[name], size, mode, interpolation, 0)
    difference = np.abs(gateway(PNGS[name], size, mode, interpolation) - expected)
    # Pillow may run its two 8-bit passes in the other order on a box than on the whole image
    assert difference.max() <= 2.0 and difference.mean() < 0.1


@pytest.mark.parametrize("interpolation", INTERPOLATIONS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_in_every_mode(
    orientation: int, mode: ResizeMode, interpolation: Interpolation
) -> None:
    """480x320 at 256: decoded at full size in every mode, so the difference is the passes'
    order alone; a crop or pad on the wrong side would shift the image."""
    data = samples.oriented_jpeg(orientation)
    difference = np.abs(gateway(data, 256, mode, interpolation) - reference(data, 256, mode,
                        interpolation, 0))  # fmt: skip
    assert difference.mean() < 0.5 and difference.max() <= 4


@pytest.mark.parametrize("size", [(4000, 3000), (3000, 4000)], ids=["landscape", "portrait"])
@pytest.mark.parametrize("mode", MODES)
def test_dct_scaled_jpegs_stay_close(mode: ResizeMode, size: tuple[int, int]) -> None:
    """A 12 MP photo decoded at 1/4 or 1/8 (the side the mode needs stays >= the size): the
    crop box is scaled to the decoded image on both axes."""
    data = samples.jpeg(samples.small_photo(5, size), quality=90)
    difference = np.abs(gateway(data, 224, mode, "bicubic") - reference(data, 224, mode,
                        "bicubic", 0))  # fmt: skip
    assert difference.mean() < 2.0


def test_longest_pads_with_the_fill_colour_where_open_clip_does() -> None:
    data = PNGS["wide"]
    got = gateway(data, 224, "longest", "bicubic", fill=200)
    expected = reference(data, 224, "longest", "bicubic", 200)
    padded = np.all(expected == 200.0, axis=-1)
    assert padded[:40].all() and padded[-40:].all()  # 640x300 -> 224x105, centred
    assert (got[padded] == 200).all()
    assert np.abs(got - expected).max() <= 1.0


@pytest.mark.parametrize(("mode", "other"), [("shortest", "squash"), ("longest", "shortest"),
                                             ("squash", "longest")])  # fmt: skip
def test_the_modes_differ_enough_for_these_checks_to_see_a_mixup(
    mode: ResizeMode, other: ResizeMode
) -> None:
    """Negative control: serving one mode where another was trained is far outside the
    tolerances above, and so is a crop one pixel off."""
    data = PNGS["wide"]
    expected = reference(data, 224, mode, "bicubic", 0)
    assert np.abs(gateway(data, 224, other, "bicubic") - expected).mean() > 10 * SHIFT
    shifted = np.roll(expected, 1, axis=1)
    assert np.abs(shifted - expected).mean() > SHIFT


def test_interpolations_differ_enough_to_be_told_apart() -> None:
    data = PNGS["small"]
    expected = reference(data, 224, "shortest", "bicubic", 0)
    assert np.abs(gateway(data, 224, "shortest", "bilinear") - expected).max() > 1.0
    assert unit(expected.ravel()) @ unit(gateway(data, 224, "shortest", "bicubic").ravel()) > 0.999


@pytest.mark.parametrize("orientation", range(1, 9))
def test_source_box_is_where_upright_takes_a_box_from(orientation: int) -> None:
    """Every box on the upright image of a 7x5 stored image, cut from the stored image with
    ``source_box`` and turned upright, is the same pixels."""
    from clip_gateway.imaging.orientation import source_box, upright

    stored = np.arange(5 * 7 * 3).reshape(5, 7, 3)
    turned = upright(stored, orientation)
    rows, cols = turned.shape[:2]
    for left in range(cols):
        for right in range(left + 1, cols + 1):
            for top in range(rows):
                for bottom in range(top + 1, rows + 1):
                    box = source_box((left, top, right, bottom), 7, 5, orientation)
                    x0, y0, x1, y1 = (int(edge) for edge in box)
                    cut = upright(stored[y0:y1, x0:x1], orientation)
                    assert np.array_equal(cut, turned[top:bottom, left:right])


def photo_in(mode: str) -> Image.Image:
    """A 300x200 photo in Pillow ``mode`` (16-bit grey spans the full 0-65535 range)."""
    rgb = samples.small_photo(7, (300, 200))
    if mode == "I;16":
        grey = np.asarray(rgb.convert("L"), np.uint16) * 257
        return Image.frombytes("I;16", rgb.size, grey.astype("<u2").tobytes())
    if mode in ("RGBA", "LA"):
        converted = rgb.convert(mode)
        converted.putalpha(Image.linear_gradient("L").resize((300, 200)))
        return converted
    return rgb.convert(mode)


PIXEL_MODES = [("PNG", "L"), ("PNG", "LA"), ("PNG", "RGBA"), ("PNG", "P"), ("PNG", "I;16"),
               ("PNG", "1"), ("GIF", "P"), ("WEBP", "RGBA")]  # fmt: skip


@pytest.mark.parametrize(("fmt", "mode"), PIXEL_MODES)
def test_every_pixel_mode_becomes_rgb_as_open_clip_converts_it(fmt: str, mode: str) -> None:
    """Grey, grey+alpha, RGBA, palette, 16-bit and 1-bit images: open_clip's
    ``.convert("RGB")`` (alpha dropped, grey repeated, the palette looked up) to rounding."""
    data = samples.encode(photo_in(mode), fmt)
    assert Image.open(io.BytesIO(data)).mode == mode  # the file really holds that mode
    for resize in MODES:
        difference = np.abs(gateway(data, 224, resize, "bicubic") -
                            reference(data, 224, resize, "bicubic", 0))  # fmt: skip
        assert difference.max() <= 2.0 and difference.mean() < 0.1, (resize, difference.mean())


@pytest.mark.parametrize("size", [(224, 500), (500, 224), (224, 224)])
@pytest.mark.parametrize("mode", MODES)
def test_a_side_already_at_the_target_is_resized_like_any_other(
    size: tuple[int, int], mode: ResizeMode
) -> None:
    """A side equal to the target takes the crop-only path on that side alone when the other
    must still be resized (squash) or cropped (shortest)."""
    data = samples.encode(samples.small_photo(8, size), "PNG")
    difference = np.abs(gateway(data, 224, mode, "bicubic") - reference(data, 224, mode,
                        "bicubic", 0))  # fmt: skip
    assert difference.max() <= 2.0 and difference.mean() < 0.1
