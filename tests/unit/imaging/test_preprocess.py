"""Bytes to the model's input: formats, limits, orientation, and agreement with open_clip's way."""

from __future__ import annotations

import io
import zlib

import numpy as np
import pytest
from PIL import Image, ImageOps

from bench.harness.photos import jpeg as jpeg_bytes
from bench.harness.photos import photo
from clip_gateway.errors import ImageTooLarge, InvalidImage, LimitExceeded, UnsupportedFormat
from clip_gateway.imaging import jpeg, orientation, work
from clip_gateway.imaging import preprocess as images
from tests import hostile, immich_reference, samples

OPTIONS = images.DecodeOptions(size=224, max_pixels=40_000_000, max_bytes=16 << 20)


def run(data: bytes, options: images.DecodeOptions = OPTIONS) -> np.ndarray:
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
        b"BM" + b"\x00" * 50,
        b"II*\x00" + b"\x00" * 20,
        b"\x00\x00\x00\x18ftypheic" + b"\x00" * 20,
    ],
    ids=["bmp", "tiff", "heic"],
)
def test_known_but_unsupported_formats_are_415(data: bytes) -> None:
    with pytest.raises(UnsupportedFormat):
        images.sniff(data)


@pytest.mark.parametrize("version", [b"GIF87a", b"GIF89a"])
def test_both_gif_versions_are_gifs(version: bytes) -> None:
    assert images.sniff(version + b"\x01\x00\x01\x00" + bytes(8)) == "gif"
    with pytest.raises(InvalidImage):
        images.sniff(version.lower() + bytes(12))


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
        run(samples.compact(0), images.DecodeOptions(224, 10**8, max_bytes=1000))


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


UNSUPPORTED = [
    (b"BM", "bmp"), (b"II*\x00", "tiff"),
    (b"MM\x00*", "tiff"), (b"8BPS", "psd"), (b"\x00\x00\x01\x00", "ico"),
    (b"\x00\x00\x00\x0cjP  \r\n\x87\n", "jpeg2000"), (b"\xff\x4f\xff\x51", "jpeg2000"),
    (b"\xff\x0a", "jpeg-xl"), (b"\x00\x00\x00\x0cJXL \r\n\x87\n", "jpeg-xl"), (b"%PDF-1.7", "pdf"),
]  # fmt: skip


@pytest.mark.parametrize(("signature", "name"), UNSUPPORTED, ids=[n for _, n in UNSUPPORTED])
def test_unsupported_formats_are_named(signature: bytes, name: str) -> None:
    with pytest.raises(UnsupportedFormat) as raised:
        images.sniff(signature + b"\x00" * 32)
    assert raised.value.reason == f"{name} images are not supported; send JPEG, PNG, WebP or GIF"


def test_webp_on_a_pillow_built_without_it_is_415_naming_the_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # pillow-simd built where libwebp's headers are missing (the GPU host's image): the upload
    # is fine, this server cannot decode it, and the sender is told so rather than "damaged"
    Image.init()
    monkeypatch.delitem(Image.OPEN, "WEBP")
    with pytest.raises(UnsupportedFormat) as raised:
        run(samples.webp(0))
    assert raised.value.reason == (
        "webp images cannot be decoded by this server (its Pillow was built without webp); "
        "send JPEG or PNG"
    )
    assert run(samples.png(0)).any()  # the others still decode


@pytest.mark.parametrize("brand", [b"heic", b"mif1", b"avif"])
def test_heif_and_avif_are_415(brand: bytes) -> None:
    with pytest.raises(UnsupportedFormat) as raised:
        images.sniff(b"\x00\x00\x00\x1cftyp" + brand + b"\x00" * 20)
    assert raised.value.reason == "HEIF/AVIF images are not supported; send JPEG, PNG, WebP or GIF"


def test_heif_told_by_a_compatible_brand_is_415_as_the_client_tells_it() -> None:
    """The client's signatures (clip_gateway/imaging/formats.py): ``mif1`` major, ``heic``
    compatible."""
    with pytest.raises(UnsupportedFormat, match="HEIF/AVIF"):
        images.sniff(b"\x00\x00\x00\x18ftypmif1\x00\x00\x00\x00heic" + b"\x00" * 20)
    with pytest.raises(UnsupportedFormat, match="HEIF/AVIF"):
        images.sniff(b"\x00\x00\x00\x18ftypmif1\x00\x00\x00\x00avif" + b"\x00" * 20)


@pytest.mark.parametrize(
    "data",
    [
        b"RIFF\x24\x00\x00\x00WAVEfmt " + b"\x00" * 20,  # RIFF, but audio
        b"\x00\x00\x00\x18ftypisom" + b"\x00" * 20,  # ISO media, but an MP4 video
        b"\x00\x00\x00\x18ftyp" + b"\x00" * 20,  # no brand
        b"PK\x03\x04 a zip file",
    ],
    ids=["wav", "mp4", "ftyp-no-brand", "zip"],
)
def test_lookalike_containers_are_not_images(data: bytes) -> None:
    with pytest.raises(InvalidImage) as raised:
        images.sniff(data)
    assert (
        raised.value.reason
        == "not an image: no JPEG, PNG, WebP or GIF signature in the first bytes"
    )


def preprocess(data: bytes, options: images.DecodeOptions = OPTIONS) -> images.Decoded:
    return images.preprocess(data, np.zeros((options.size, options.size, 3), np.uint8), options)


@pytest.mark.slow
def test_what_was_decoded_is_reported() -> None:
    compact, big = samples.compact(0), samples.progressive_jpeg(2)
    png, webp, cmyk = samples.png(0), samples.webp(0), samples.cmyk_jpeg(0)
    assert preprocess(compact) == images.Decoded("jpeg", 341, 256, 341 * 256, len(compact))
    # 2400x1800 is decoded at 1/8 (300x225); CMYK goes through Pillow, scaled by its draft (1/2)
    assert preprocess(big) == images.Decoded("jpeg", 2400, 1800, 300 * 225, len(big))
    assert preprocess(cmyk) == images.Decoded("jpeg", 640, 480, 320 * 240, len(cmyk))
    assert preprocess(png) == images.Decoded("png", 640, 480, 640 * 480, len(png))
    assert preprocess(webp) == images.Decoded("webp", 640, 480, 640 * 480, len(webp))


def test_empty_image_message() -> None:
    with pytest.raises(InvalidImage) as raised:
        run(b"")
    assert raised.value.reason == "empty image (0 bytes)"


def test_byte_limit_is_inclusive_and_reported() -> None:
    data = samples.compact(0)
    run(data, images.DecodeOptions(224, 10**8, max_bytes=len(data)))
    with pytest.raises(LimitExceeded) as raised:
        run(data, images.DecodeOptions(224, 10**8, max_bytes=len(data) - 1))
    assert raised.value.reason == f"image is {len(data)} bytes; the limit is {len(data) - 1}"
    assert raised.value.extra == {"limit": len(data) - 1}


@pytest.mark.parametrize(
    ("data", "size"), [(samples.compact(0), (341, 256)), (samples.png(0), (640, 480))]
)
def test_pixel_limit_is_inclusive_and_reported(data: bytes, size: tuple[int, int]) -> None:
    pixels = size[0] * size[1]
    run(data, images.DecodeOptions(224, max_pixels=pixels, max_bytes=1 << 30))
    with pytest.raises(ImageTooLarge) as raised:
        run(data, images.DecodeOptions(224, max_pixels=pixels - 1, max_bytes=1 << 30))
    assert raised.value.reason == (
        f"image is {size[0]}x{size[1]} ({pixels} pixels); the limit is {pixels - 1} pixels"
    )
    assert raised.value.extra == {"limit": pixels - 1, "width": size[0], "height": size[1]}


def test_a_huge_header_is_refused_before_any_decoder_runs() -> None:
    png = bytearray(samples.png(0))
    png[16:24] = (100_000).to_bytes(4, "big") * 2
    png[29:33] = zlib.crc32(bytes(png[12:29])).to_bytes(4, "big")
    with pytest.raises(ImageTooLarge, match="100000x100000"):
        run(bytes(png))


@pytest.mark.parametrize(
    ("data", "detail"),
    [
        (b"\xff\xd8\xff\xe0garbage", "JPEG without a frame header"),
        (samples.truncated_jpeg(), "corrupt or truncated JPEG: "),
        (b"\x89PNG\r\n\x1a\n" + b"garbage" * 5, "unreadable png header: "),
        (samples.png(0)[:200], "corrupt or truncated png image: "),
    ],
    ids=["jpeg-header", "jpeg-data", "png-header", "png-data"],
)
def test_broken_image_messages(data: bytes, detail: str) -> None:
    with pytest.raises(InvalidImage) as raised:
        run(data)
    assert raised.value.reason.startswith(detail)


def test_scan_limit_applies_to_progressive_jpegs() -> None:
    data = samples.progressive_jpeg(5, (640, 480))
    options = images.DecodeOptions(224, 10**8, 1 << 30, max_scans=3)
    with pytest.raises(InvalidImage) as raised:
        run(data, options)
    assert raised.value.reason == "JPEG has more than 3 scans"


def test_dc_only_option_decides_how_a_progressive_jpeg_is_decoded() -> None:
    """All scans decoded: exactly the baseline encoding's pixels. DC scans only: close to them."""
    photo = samples.small_photo(7)  # 640x480: decoded at 1/8 for a 56-pixel input
    progressive, baseline = jpeg_bytes(photo, progressive=True), jpeg_bytes(photo)

    def at_56(data: bytes, dc_only: bool) -> np.ndarray:
        options = images.DecodeOptions(56, 10**8, 1 << 30, progressive_dc_only=dc_only)
        out = np.zeros((56, 56, 3), np.uint8)
        images.preprocess(data, out, options)
        return out

    assert np.array_equal(at_56(progressive, dc_only=False), at_56(baseline, dc_only=False))
    dc = at_56(progressive, dc_only=True)
    assert not np.array_equal(dc, at_56(baseline, dc_only=False))
    assert np.abs(dc.astype(int) - at_56(baseline, dc_only=False)).mean() < 3


def pillow_scaled(data: bytes) -> bytes:
    """What Pillow makes of a JPEG at the DCT scale the gateway asks for, as a lossless PNG."""
    image = Image.open(io.BytesIO(data))
    image.draft("RGB", (224, 224))
    return samples.encode(image.convert("RGB"), "PNG")


def test_cmyk_and_ycck_jpegs_become_rgb_like_pillow_makes_them() -> None:
    """libjpeg converts them (no Pillow on the JPEG path): within a level of Pillow's way."""
    cmyk = samples.cmyk_jpeg(0)
    adobe = cmyk.index(b"Adobe") + 11  # APP14 transform byte: 0 = CMYK, 2 = YCCK
    ycck = cmyk[:adobe] + b"\x02" + cmyk[adobe + 1 :]
    for data, colorspace in [(cmyk, "CMYK"), (ycck, "YCCK")]:
        assert jpeg.read_header(data).colorspace == colorspace
        difference = np.abs(run(data).astype(int) - run(pillow_scaled(data)))
        assert difference.mean() < 1.5 and difference.max() <= 16


def transposed(a: np.ndarray, method: Image.Transpose | None) -> np.ndarray:
    return a if method is None else np.asarray(Image.fromarray(a).transpose(method))


#: EXIF orientation -> the transpose that makes the image upright (ImageOps.exif_transpose's).
UPRIGHT = {
    1: None,
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}


@pytest.mark.parametrize("orientation", range(1, 9))
def test_orientation_is_exactly_the_exif_transpose_of_the_output(orientation: int) -> None:
    upright = run(samples.oriented_jpeg(1))
    assert np.array_equal(
        run(samples.oriented_jpeg(orientation)), transposed(upright, UPRIGHT[orientation])
    )


def test_png_exif_orientation_is_applied() -> None:
    photo = samples.small_photo(0, (480, 320))
    plain = samples.encode(photo, "PNG")
    exif = Image.Exif()
    exif[orientation.TAG] = 6
    rotated = samples.encode(photo, "PNG", exif=exif.tobytes())
    assert np.array_equal(run(rotated), transposed(run(plain), UPRIGHT[6]))


def test_exif_without_a_usable_orientation_changes_nothing() -> None:
    photo = samples.small_photo(0, (480, 320))
    plain = jpeg_bytes(photo)
    exif = Image.Exif()
    exif[0x010F] = "Camera maker, no orientation tag"
    no_tag = samples.encode(photo, "JPEG", quality=90, optimize=True, exif=exif.tobytes())
    unreadable = plain[:2] + b"\xff\xe1\x00\x10Exif\x00\x00garbage!" + plain[2:]
    for data in (no_tag, unreadable):
        assert jpeg.exif_segment(data) is not None
        assert np.array_equal(run(data), run(plain))


def test_a_square_of_the_input_size_is_the_exact_centre_crop() -> None:
    photo = np.asarray(samples.small_photo(0))  # 480x640
    tall, wide = photo[:448, :224], photo[:224, :448]
    assert np.array_equal(run(samples.encode(Image.fromarray(tall), "PNG")), tall[112:336])
    assert np.array_equal(run(samples.encode(Image.fromarray(wide), "PNG")), wide[:, 112:336])


@pytest.mark.parametrize("transpose", [False, True], ids=["portrait", "landscape"])
def test_resize_reads_only_the_centre_square(transpose: bool) -> None:
    """Red and blue bands outside the centre 300x300 of a 300x600 image never reach the output."""
    bands = np.zeros((600, 300, 3), np.uint8)
    bands[:140] = (255, 0, 0)
    bands[140:460] = (0, 200, 0)
    bands[460:] = (0, 0, 255)
    if transpose:
        bands = bands.transpose(1, 0, 2).copy()
    out = run(samples.encode(Image.fromarray(bands), "PNG"))
    assert np.all(out == (0, 200, 0))


def _png(pixels: np.ndarray, turn: int) -> bytes:
    """The same pixels, lossless, with the same EXIF orientation: Pillow's path decodes it."""
    exif = Image.Exif()
    exif[0x0112] = turn
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG", exif=exif.tobytes())
    return buffer.getvalue()


@pytest.mark.parametrize("turn", range(1, 9))
@pytest.mark.parametrize(
    ("stored", "mode"),
    [((298, 224), "shortest"), ((224, 298), "shortest"), ((224, 168), "longest"),
     ((224, 224), "squash")],
)  # fmt: skip
def test_a_jpeg_already_the_resized_size_is_only_cropped(
    stored: tuple[int, int], mode: images.ResizeMode, turn: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A JPEG the size open_clip's resize makes (the client's uploads are) is decoded to packed
    RGB and cropped, never handed to Pillow: the same pixels Pillow's path makes of the same
    decoded image (a lossless PNG of it), in every EXIF orientation and resize mode."""
    data = jpeg_bytes(photo(*stored, seed=turn), 85, orientation=turn)
    decoded = jpeg.decode(data, jpeg.walk(data, max_scans=8, dc_only_for=None), 224)
    options = images.DecodeOptions(size=224, max_pixels=1 << 26, max_bytes=1 << 26,
                                  resize_mode=mode)  # fmt: skip
    expected = run(_png(decoded, turn), options)

    def pillow_path(self: object) -> Image.Image:
        raise AssertionError("a plain crop went through Pillow")

    monkeypatch.setattr(images._Jpeg, "image", pillow_path)
    np.testing.assert_array_equal(run(data, options), expected)


def test_a_jpeg_that_needs_resampling_still_goes_through_pillow() -> None:
    data = samples.compact(0)  # 341x256: Resize(224) makes 298x224
    called: list[bool] = []
    original = images._Jpeg.image

    def spy(self: images._Jpeg) -> Image.Image:
        called.append(True)
        return original(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(images._Jpeg, "image", spy)
        run(data)
    assert called == [True]


def _fail(self: object, *args: object) -> np.ndarray:
    raise AssertionError("decoded into an array of its own")


@pytest.mark.parametrize("progressive", [False, True], ids=["baseline", "progressive"])
def test_a_centre_square_of_the_input_size_is_decoded_straight_into_the_batch_row(
    progressive: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client's uploads (the centre square, 224 px, upright): libjpeg writes the batch row
    itself, and the row holds exactly what the decode-and-copy path puts there."""
    data = jpeg_bytes(photo(224, 224, seed=3), 85, progressive=progressive)
    expected = jpeg.decode(data, jpeg.walk(data, max_scans=16, dc_only_for=None), 224)
    batch = np.zeros((3, 224, 224, 3), np.uint8)
    monkeypatch.setattr(images._Jpeg, "crop", _fail)
    assert images.preprocess(data, batch[1], OPTIONS).row == "into"
    np.testing.assert_array_equal(batch[1], expected)
    assert not batch[0].any() and not batch[2].any()  # its neighbours untouched


def test_a_centre_square_can_be_decoded_and_copied_instead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``into_row=False``: the same pixels through an array of its own (the copy)."""
    data = jpeg_bytes(photo(224, 224, seed=3), 85)
    expected = run(data)
    monkeypatch.setattr(images._Jpeg, "into", _fail)
    out = np.zeros((224, 224, 3), np.uint8)
    assert images.preprocess(data, out, OPTIONS, into_row=False).row == "copy"
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize(
    "data",
    [samples.compact(0), jpeg_bytes(photo(298, 224, seed=1), 85), samples.png(0),
     jpeg_bytes(photo(224, 224, seed=2), 85, orientation=6)],
    ids=["resized", "cropped", "png", "turned"],
)  # fmt: skip
def test_only_a_jpeg_that_is_the_input_as_it_is_has_a_row_way(data: bytes) -> None:
    out = np.zeros((224, 224, 3), np.uint8)
    assert images.preprocess(data, out, OPTIONS).row is None


def test_a_row_libjpeg_cannot_write_whole_takes_the_copy() -> None:
    """A strided ``out`` (not one C-contiguous block) gets the same pixels through the copy."""
    data = jpeg_bytes(photo(224, 224, seed=4), 85)
    expected = run(data)
    wide = np.zeros((224, 448, 3), np.uint8)
    images.preprocess(data, wide[:, ::2], OPTIONS)
    np.testing.assert_array_equal(wide[:, ::2], expected)
    assert not wide[:, 1::2].any()


@pytest.mark.parametrize("cut", [0.5, 0.9])
def test_a_truncated_square_written_into_its_row_is_refused(cut: float) -> None:
    data = jpeg_bytes(photo(224, 224, seed=5), 85)
    with pytest.raises(InvalidImage) as raised:
        run(data[: int(len(data) * cut)])
    assert raised.value.reason.startswith("corrupt or truncated JPEG")


def test_a_square_that_decodes_to_another_size_than_walked_is_refused() -> None:
    """Bytes whose decode is not the size their walked header says (a larger one would not
    fit the row; a smaller one would leave part of it stale): refused either way."""
    data = jpeg_bytes(photo(224, 224, seed=6), 85)
    big = jpeg_bytes(photo(320, 320, seed=6), 85)
    layout = jpeg.walk(data, max_scans=8)
    square = images._Jpeg(big, layout, 224, False, False, (224, 224))
    out = np.zeros((224, 224, 3), np.uint8)
    with pytest.raises(InvalidImage) as raised:
        square.into(out)
    assert "buffer is too small" in raised.value.reason
    assert not out.any()  # simplejpeg checks the size before libjpeg writes a row
    small = jpeg_bytes(photo(200, 200, seed=6), 85)
    with pytest.raises(InvalidImage) as raised:
        images._Jpeg(small, layout, 224, False, False, (224, 224)).into(out)
    assert raised.value.reason == (
        "JPEG decoded to 200x200, not the 224x224 its header gives at this scale"
    )


def immich(
    data: bytes,
    interpolation: images.Interpolation = "bicubic",
    resize_mode: images.ResizeMode = "shortest",
) -> tuple[np.ndarray, images.Decoded]:
    options = images.DecodeOptions(224, 1 << 30, 1 << 30, resize_mode, interpolation,
                                   variant="immich")  # fmt: skip
    out = np.zeros((224, 224, 3), np.uint8)
    return out, images.preprocess(data, out, options)


@pytest.mark.parametrize(
    ("size", "fmt"),
    [((299, 224), "PNG"), ((224, 303), "PNG"), ((641, 300), "JPEG"), ((300, 641), "PNG"),
     ((1500, 1400), "PNG"), ((1500, 1400), "JPEG"), ((500, 500), "PNG")],
)  # fmt: skip
def test_immich_variant_makes_immichs_own_pixels(size: tuple[int, int], fmt: str) -> None:
    """Immich's transform (tests/immich_reference.py): truncated long side and crop offsets
    (299 wide: left 37, where open_clip's rounding says 38), one bicubic resize of every pixel
    (1500x1400: no DCT scaling, no pre-reduction). Only Pillow's rounding of a box may differ."""
    data = samples.encode(photo(*size, seed=1), fmt)
    out, decoded = immich(data)
    difference = np.abs(out.astype(int) - immich_reference.pixels(data, 224))
    assert difference.max() <= 1 and difference.mean() < 0.001
    assert decoded.decoded_pixels == size[0] * size[1]


def test_immich_variant_ignores_the_models_interpolation_mode_and_exif_orientation() -> None:
    for turn in (1, 3, 6):
        data = jpeg_bytes(photo(641, 300, seed=turn), orientation=turn)
        expected = immich_reference.pixels(data, 224)  # Pillow never turns it
        for mode in ("shortest", "longest", "squash"):
            out, _ = immich(data, interpolation="bilinear", resize_mode=mode)
            assert np.abs(out.astype(int) - expected).max() <= 1


@pytest.mark.slow
def test_immich_variant_decodes_every_scan_of_a_progressive_jpeg() -> None:
    """2400x1800 at 224 would be decoded at 1/8 from its DC scans: Immich decodes it all."""
    data = samples.progressive_jpeg(2)
    out, decoded = immich(data)
    assert np.abs(out.astype(int) - immich_reference.pixels(data, 224)).max() <= 1
    assert decoded.decoded_pixels == 2400 * 1800


@pytest.mark.parametrize(
    ("size", "reduced"),
    [((2000, 300), False), ((300, 2000), False), ((1600, 672), False), ((1600, 700), True),
     ((700, 1600), True)],
)  # fmt: skip
def test_a_source_over_three_times_the_target_is_pre_reduced(
    size: tuple[int, int], reduced: bool
) -> None:
    """Pillow's ``reducing_gap=3.0`` (a box average, then the filter) when the short side of
    what is read is over 3x the target's, else one exact resize: squashed, every pixel read."""
    source = photo(*size, seed=3)
    options = images.DecodeOptions(224, 1 << 30, 1 << 30, resize_mode="squash")
    gap = 3.0 if reduced else None
    expected = source.resize((224, 224), Image.Resampling.BICUBIC, reducing_gap=gap)
    assert np.array_equal(run(samples.encode(source, "PNG"), options), np.asarray(expected))


def test_a_large_jpeg_fitted_by_its_long_side_is_decoded_at_the_long_sides_scale() -> None:
    """2400x1200 at 224, ``longest``: 1/8 keeps the long side (300x150); the short side's
    scale would be 1/4. The result is the resize of the whole image, padded top and bottom."""
    source = photo(2400, 1200, seed=4)
    options = images.DecodeOptions(224, 1 << 30, 1 << 30, resize_mode="longest")
    out = np.zeros((224, 224, 3), np.uint8)
    decoded = images.preprocess(jpeg_bytes(source), out, options)
    assert decoded.decoded_pixels == 300 * 150
    expected = np.zeros((224, 224, 3), np.uint8)
    expected[56:168] = np.asarray(source.resize((224, 112), Image.Resampling.BICUBIC))
    assert np.all(out[:56] == 0) and np.all(out[168:] == 0)
    assert mean_abs(out, expected) < 2.5


#: coding -> an image of it (the name's first word is its format)
PRICED = {
    "png": samples.png(0),
    "webp-lossy": samples.webp(0),
    "gif": samples.gif(0),
    "jpeg-baseline": samples.compact(0),
    "jpeg-progressive": samples.progressive_jpeg(5, (640, 480)),
    "jpeg-arithmetic": hostile.jpeg_arithmetic(),  # 100 MP: open_clip's 1/8 scale only
}


@pytest.mark.parametrize(
    ("coding", "variant"),
    [(coding, variant) for coding in PRICED for variant in ("open_clip", "immich")
     if (coding, variant) != ("jpeg-arithmetic", "immich")],
)  # fmt: skip
def test_the_reported_price_is_admissions_estimate_of_the_same_bytes(
    coding: str, variant: images.Variant
) -> None:
    """What admission learns against (imaging/work.py): the same price it charged."""
    options = images.DecodeOptions(224, 10**8, 1 << 30, variant=variant)
    priced = preprocess(PRICED[coding], options).work
    assert priced == work.estimate(PRICED[coding], plan=options.plan)
    assert (priced.format, priced.coding) == (coding.split("-")[0], coding)


def test_a_gif_whose_first_frame_outgrows_its_screen_is_refused() -> None:
    """The budget was computed for the logical screen; Pillow's canvas grows to the frame."""
    gif = bytearray(samples.encode(photo(300, 240, seed=0).convert("P"), "GIF"))
    gif[6:10] = (250).to_bytes(2, "little") + (200).to_bytes(2, "little")
    with pytest.raises(InvalidImage) as raised:
        run(bytes(gif))
    assert raised.value.reason == "gif header says 250x200 but the image is 300x240"


def test_a_png_chunk_longer_than_the_file_is_an_unreadable_header() -> None:
    png = samples.png(0)
    idat = png.index(b"IDAT") - 4
    cut = png[:idat] + (10_000_000).to_bytes(4, "big") + b"abCd" + b"x" * 100 + png[idat:]
    with pytest.raises(InvalidImage) as raised:
        run(cut)
    assert raised.value.reason == "cannot read png header: Truncated File Read"


def test_a_jpeg_decoded_to_another_size_than_its_header_gives_is_refused() -> None:
    """libjpeg scales as the header says; were it not to, the crop would read the wrong box."""
    data = samples.compact(0)  # 341x256
    layout = jpeg.walk(data, max_scans=8)
    claimed = images._Jpeg(data, layout, 224, False, False, (340, 255))
    with pytest.raises(InvalidImage) as raised:
        claimed.crop((0, 0, 224, 224))
    assert raised.value.reason == (
        "JPEG decoded to 341x256, not the 340x255 its header gives at this scale"
    )
