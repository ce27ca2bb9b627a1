"""One image's bytes to uint8 ``[S, S, 3]``: sniff, check its cost, decode small, resize, crop.

Mirrors open_clip's pipeline (bicubic antialiased resize of the short side, centre crop) but never
decodes a large JPEG at full size (imaging/jpeg.py), crops before it resamples (the resize reads
only the centre square), and applies EXIF orientation to the 224x224 result, where it is a cheap
array view: a centred square crop commutes with rotations and flips.

Untrusted bytes: before any decoder runs, the container's own header (imaging/jpeg.py,
imaging/containers.py) says what decoding will cost: the pixels, the decoder's peak memory
(a progressive JPEG's whole-image coefficient buffer, a full-size PNG/WebP/GIF canvas and its RGB
copy) and, for JPEG, the blocks times scans it will visit. Anything over the budget is refused
with the item's dimensions and the limit it broke. EXIF orientation comes from our bounded reader
(imaging/orientation.py), never from Pillow's IFD loader.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np
from PIL import Image

from gateway.errors import ImageTooLarge, InvalidImage, LimitExceeded, UnsupportedFormat
from gateway.imaging import containers, jpeg, orientation

MiB = 1 << 20
#: JPEG work cap: 8x8 blocks times the scans that decode them. A 24 MP progressive photo decoded
#: in full visits ~6 M; a 100 MP file with 256 full-image scans would visit ~600 M.
MAX_BLOCK_VISITS = 200_000_000
#: Bytes per pixel of a Pillow decode: its own buffer (RGB is stored as RGBX) plus the RGB copy.
_PILLOW_BYTES_PER_PIXEL = {"png": 8, "webp": 8, "gif": 5}


#: Formats recognised by signature but not accepted (415 rather than "not an image").
_UNSUPPORTED_SIGNATURES: tuple[tuple[bytes, int, str], ...] = (
    (b"BM", 0, "bmp"),
    (b"II*\x00", 0, "tiff"),
    (b"MM\x00*", 0, "tiff"),
    (b"8BPS", 0, "psd"),
    (b"\x00\x00\x01\x00", 0, "ico"),
    (b"\x00\x00\x00\x0cjP  ", 0, "jpeg2000"),
    (b"\xff\x4f\xff\x51", 0, "jpeg2000"),
    (b"\xff\x0a", 0, "jpeg-xl"),
    (b"\x00\x00\x00\x0cJXL ", 0, "jpeg-xl"),
    (b"%PDF", 0, "pdf"),
)
_HEIF_BRANDS = {b"heic", b"heix", b"hevc", b"heim", b"heis", b"mif1", b"msf1", b"avif", b"avis"}


@dataclass(frozen=True)
class ImageOptions:
    size: int
    max_pixels: int
    max_bytes: int
    #: Decoder peak memory allowed per image, estimated from the header before decoding.
    max_decode_bytes: int = 256 * MiB
    #: Progressive JPEGs with more scans than this are refused (CPU bombs).
    max_scans: int = 256
    progressive_dc_only: bool = True


@dataclass(frozen=True)
class Decoded:
    """What was decoded, for spans and metrics."""

    format: str
    width: int
    height: int
    decoded_pixels: int
    encoded_bytes: int


ACCEPTED = "JPEG, PNG, WebP or GIF"


def sniff(data: bytes) -> str:
    """``jpeg`` / ``png`` / ``webp`` / ``gif``, or raise 415 (known, unsupported) / 422."""
    if data.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    for signature, offset, name in _UNSUPPORTED_SIGNATURES:
        if data[offset : offset + len(signature)] == signature:
            raise UnsupportedFormat(f"{name} images are not supported; send {ACCEPTED}")
    if data[4:8] == b"ftyp" and data[8:12] in _HEIF_BRANDS:
        raise UnsupportedFormat(f"HEIF/AVIF images are not supported; send {ACCEPTED}")
    raise InvalidImage(f"not an image: no {ACCEPTED} signature in the first bytes")


def preprocess(data: bytes, out: np.ndarray, options: ImageOptions) -> Decoded:
    """Decode ``data`` and write the model's input into ``out`` (``[S, S, 3]`` uint8)."""
    if not data:
        raise InvalidImage("empty image (0 bytes)")
    if len(data) > options.max_bytes:
        raise LimitExceeded(
            f"image is {len(data)} bytes; the limit is {options.max_bytes}",
            limit=options.max_bytes,
        )
    kind = sniff(data)
    image, turn, info = _jpeg(data, options) if kind == "jpeg" else _pillow(data, kind, options)
    square = _resize_centre(image, options.size)
    # RGBX or RGB in, packed RGB out, in one copy
    pixels = np.frombuffer(square.tobytes("raw", "RGB"), np.uint8)
    out[...] = orientation.upright(pixels.reshape(options.size, options.size, 3), turn)
    return info


def _check_cost(width: int, height: int, peak_bytes: int, options: ImageOptions) -> None:
    """Refuse before decoding: too many pixels, or more decoder memory than the budget."""
    if width * height > options.max_pixels:
        raise ImageTooLarge(
            f"image is {width}x{height} ({width * height} pixels); the limit is "
            f"{options.max_pixels} pixels",
            limit=options.max_pixels,
            width=width,
            height=height,
        )
    if peak_bytes > options.max_decode_bytes:
        raise ImageTooLarge(
            f"image is {width}x{height}: decoding it needs about "
            f"{math.ceil(peak_bytes / MiB)} MiB, over the {options.max_decode_bytes // MiB} MiB "
            "budget per image",
            limit=options.max_decode_bytes,
            width=width,
            height=height,
        )


def _jpeg(data: bytes, options: ImageOptions) -> tuple[Image.Image, int, Decoded]:
    try:
        layout = jpeg.walk(
            data,
            max_scans=options.max_scans,
            dc_only_for=options.size if options.progressive_dc_only else None,
        )
    except jpeg.UnsupportedJpeg as exc:
        raise UnsupportedFormat(str(exc)) from exc
    except jpeg.JpegError as exc:
        raise InvalidImage(str(exc)) from exc
    width, height = layout.width, layout.height
    divisor = jpeg.scale_divisor(width, height, options.size)
    scaled = math.ceil(width / divisor) * math.ceil(height / divisor)
    # the coefficient buffer and the decoded RGBX array (Pillow maps it without a copy)
    _check_cost(width, height, layout.coefficient_bytes + scaled * 4, options)
    decoded_scans = layout.dc_scans if layout.dc_only is not None else layout.scans
    # one scan visits each block once: within the pixel limit that is always far below the cap
    if decoded_scans > 1 and layout.blocks * decoded_scans > MAX_BLOCK_VISITS:
        raise ImageTooLarge(
            f"image is {width}x{height} with {layout.scans} scans: decoding it would visit "
            f"{layout.blocks * decoded_scans} blocks, over the limit of {MAX_BLOCK_VISITS}",
            width=width,
            height=height,
        )
    try:
        rgbx = jpeg.decode(data, layout, options.size, rgbx=True)
    except jpeg.JpegError as exc:
        raise InvalidImage(str(exc)) from exc
    turn = orientation.from_tiff(data, *layout.exif) if layout.exif else 1
    height, width = rgbx.shape[:2]
    info = Decoded("jpeg", layout.width, layout.height, width * height, len(data))
    # RGBX is Pillow's own layout for RGB: the image maps the decoded array, no copy
    return Image.frombuffer("RGBX", (width, height), rgbx, "raw", "RGBX", 0, 1), turn, info


_CONTAINERS = {"png": containers.png, "webp": containers.webp, "gif": containers.gif}


def _pillow(data: bytes, kind: str, options: ImageOptions) -> tuple[Image.Image, int, Decoded]:
    try:
        header = _CONTAINERS[kind](data)
    except containers.ContainerError as exc:
        raise InvalidImage(f"unreadable {kind} header: {exc}") from exc
    width, height = header.width, header.height
    _check_cost(width, height, width * height * _PILLOW_BYTES_PER_PIXEL[kind], options)
    try:
        image = Image.open(io.BytesIO(data), formats=[kind.upper()])
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageTooLarge(str(exc)) from exc
    except Exception as exc:  # Pillow raises many types for hostile headers
        raise InvalidImage(f"cannot read {kind} header: {exc}") from exc
    with image:
        if image.size != (width, height):  # our budget was computed for the size we read
            raise InvalidImage(
                f"{kind} header says {width}x{height} but the image is "
                f"{image.size[0]}x{image.size[1]}"
            )
        try:
            image.load()  # GIF and animated WebP: the first frame
            rgb = image if image.mode == "RGB" else image.convert("RGB")
        except MemoryError:
            raise
        except Exception as exc:
            raise InvalidImage(f"corrupt or truncated {kind} image: {exc}") from exc
    turn = orientation.from_tiff(data, *header.exif) if header.exif else 1
    return rgb, turn, Decoded(kind, width, height, width * height, len(data))


def _resize_centre(image: Image.Image, size: int) -> Image.Image:
    """Bicubic, antialiased resize of the centre square to ``size`` x ``size``."""
    width, height = image.size
    side = min(width, height)
    left, top = (width - side) / 2, (height - side) / 2
    if side == size and left.is_integer() and top.is_integer():
        return image.crop((int(left), int(top), int(left) + size, int(top) + size))
    # reducing_gap: a box pre-reduction for PNG/WebP/GIF, which have no DCT scaling.
    return image.resize(
        (size, size),
        Image.Resampling.BICUBIC,
        box=(left, top, left + side, top + side),
        reducing_gap=3.0 if side > 3 * size else None,
    )
