"""One image's bytes to uint8 ``[S, S, 3]``: sniff, check its cost, decode small, resize, crop.

Mirrors open_clip's inference transform for the model's resize mode (the model repository says
which, clip_gateway/model/contract.py ``preprocess``), with its interpolation (bicubic or bilinear,
antialiased as Pillow always is):

- ``shortest``: the short side to S, centre crop (``Resize`` + ``CenterCrop``). The crop comes
  first here (the resize reads only the centre square);
- ``longest``: the long side to S, centred on an S x S canvas of ``fill_color``
  (``ResizeKeepRatio(longest=1)`` + ``CenterCropOrPad``);
- ``squash``: both sides to S, aspect ratio not kept.

A large JPEG is never decoded at full size (imaging/jpeg.py): the DCT scale keeps the side the
resize needs (short, or long for ``longest``) at or above S. EXIF orientation is applied to the
resized result, where it is a cheap array view (a centred square crop and a squash commute with
rotations and flips; ``longest`` pads after orienting, as open_clip does).

Untrusted bytes: before any decoder runs, the container's own header (imaging/jpeg.py,
imaging/containers.py) says what decoding will cost: the pixels, the decoder's peak memory
(a progressive JPEG's whole-image coefficient buffer, a full-size PNG/WebP/GIF canvas and its RGB
copy) and, for JPEG, the blocks times scans it will visit. Anything over the budget is refused
with the item's dimensions and the limit it broke. EXIF orientation comes from our bounded reader
(imaging/orientation.py), never from Pillow's IFD loader.
"""

from __future__ import annotations

import functools
import io
import math
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np
from PIL import Image, UnidentifiedImageError

from clip_gateway.errors import ImageTooLarge, InvalidImage, LimitExceeded, UnsupportedFormat
from clip_gateway.imaging import containers, formats, jpeg, orientation, paths, work

MiB = 1 << 20
#: JPEG work cap: 8x8 blocks times the scans that decode them. A 24 MP progressive photo decoded
#: in full visits ~6 M; a 100 MP file with 256 full-image scans would visit ~600 M.
MAX_BLOCK_VISITS = 200_000_000
#: libjpeg's and zlib's own working memory (tables, row buffers), on top of the image buffers.
DECODER_OVERHEAD = work.DECODER_OVERHEAD


ResizeMode = Literal["shortest", "longest", "squash"]
Interpolation = Literal["bicubic", "bilinear"]
#: Whose preprocessing an image gets: open_clip's (the model's own transform, from its config) or
#: Immich's ML server's (its /predict, docs/IMMICH.md). The same values as text's ``Variant``
#: (its cleaning) and the embedding cache's key: the pipeline passes one value to both.
Variant = Literal["open_clip", "immich"]
_RESAMPLING = {"bicubic": Image.Resampling.BICUBIC, "bilinear": Image.Resampling.BILINEAR}


@dataclass(frozen=True)
class DecodeOptions:
    """How ``preprocess`` makes an image's pixels: the served model's preprocessing (the
    backend's ``ModelPreprocessing``, resolved), whose variant, and the decoder's limits."""

    size: int
    max_pixels: int
    max_bytes: int
    resize_mode: ResizeMode = "shortest"
    interpolation: Interpolation = "bicubic"
    #: ``longest``: the colour around the resized image.
    fill_color: tuple[int, int, int] = (0, 0, 0)
    #: Decoder peak memory allowed per image, estimated from the header before decoding.
    max_decode_bytes: int = 256 * MiB
    #: Progressive JPEGs with more scans than this are refused (CPU bombs).
    max_scans: int = 256
    progressive_dc_only: bool = True
    #: ``immich``: Immich's own ML server's transform instead of open_clip's (its /predict,
    #: docs/IMMICH.md): the short side to S with the long side truncated, a centre crop at
    #: truncated offsets, bicubic, no EXIF orientation (its previews are stored upright), whatever
    #: the model's resize mode and interpolation say.
    variant: Variant = "open_clip"

    @functools.cached_property
    def plan(self) -> work.Plan:
        """The decode these options run, as admission prices it (imaging/work.py)."""
        return work.Plan(
            size=self.size,
            resize_mode=self.resize_mode,
            full_size=self.variant == "immich",
            dc_only=self.progressive_dc_only and self.variant != "immich",
            max_pixels=self.max_pixels,
            max_decode_bytes=self.max_decode_bytes,
            max_scans=self.max_scans,
        )


@dataclass(frozen=True)
class Decoded:
    """What was decoded, for spans and metrics."""

    format: str
    width: int
    height: int
    decoded_pixels: int
    encoded_bytes: int
    #: The decode price admission charged for it (imaging/work.py): what it learns against.
    work: work.Work = field(default=work.REFUSED, compare=False)
    #: A JPEG that was the model's input as it is (the client's centre squares): whether
    #: libjpeg wrote its batch row (``into``) or decoded into an array of its own, then copied
    #: (``copy``); None for every other image.
    row: Literal["into", "copy"] | None = field(default=None, compare=False)


#: The formats decoded here (the client converts the others before upload).
SERVED = frozenset({"jpeg", "png", "webp", "gif"})
ACCEPTED = "JPEG, PNG, WebP or GIF"


def sniff(data: bytes) -> str:
    """``jpeg`` / ``png`` / ``webp`` / ``gif``, or raise 415 (known, unsupported) / 422."""
    kind = formats.identify(data)
    if kind is not None and kind in SERVED:
        return kind
    if name := formats.unsupported(data):
        raise UnsupportedFormat(f"{name} images are not supported; send {ACCEPTED}")
    if kind is not None:  # HEIF or AVIF: the client converts them (clip_gateway/client/compact.py)
        raise UnsupportedFormat(f"HEIF/AVIF images are not supported; send {ACCEPTED}")
    raise InvalidImage(f"not an image: no {ACCEPTED} signature in the first bytes")


def preprocess(
    data: bytes,
    out: np.ndarray,
    options: DecodeOptions,
    priced: work.Work | None = None,
    *,
    into_row: bool = True,
) -> Decoded:
    """Decode ``data`` and write the model's input into ``out`` (``[S, S, 3]`` uint8).
    ``priced``: the price admission gave these bytes under ``options.plan``; a JPEG walked whole
    for it is not walked again. ``into_row``: a JPEG whose whole upright image is the model's
    input is decoded straight into ``out`` (else into an array of its own, then copied: which
    costs less depends on the CPU, pipeline/batching.py ``RowWrites``)."""
    if not data:
        raise InvalidImage("empty image (0 bytes)")
    if len(data) > options.max_bytes:
        raise LimitExceeded(
            f"image is {len(data)} bytes; the limit is {options.max_bytes}",
            limit=options.max_bytes,
        )
    kind = sniff(data)
    if kind == "jpeg":
        source, turn, info = _jpeg(data, options, priced)  # walked, priced, not yet decoded
        stored = source.size
    else:
        image, turn, info = _pillow(data, kind, options)
        stored = image.size
    if options.variant == "immich":
        turn = 1  # Immich's decode_pil never reads EXIF orientation
    # the geometry of open_clip's transform on the full-size upright image...
    transposed = turn >= 5
    width, height = (info.height, info.width) if transposed else (info.width, info.height)
    box, (cols, rows) = _geometry(width, height, options)
    # ...as a box on the stored image, scaled to what is decoded (DCT scaling)
    left, top, right, bottom = orientation.source_box(box, info.width, info.height, turn)
    sx, sy = stored[0] / info.width, stored[1] / info.height
    scaled = (cols, rows) if not transposed else (rows, cols)
    region = (left * sx, top * sy, right * sx, bottom * sy)
    crop = _crop(scaled, region)
    if crop is None:
        resized = _resize_box(
            source.image() if kind == "jpeg" else image,
            scaled,
            region,
            "bicubic" if options.variant == "immich" else options.interpolation,
            reduce=options.variant != "immich",
        )
        pixels = _rgb(resized)
    elif kind == "jpeg":
        # already the size open_clip's resize makes (the client's uploads are): no resampling,
        # no Pillow; decoded as packed RGB and cropped by the one copy into ``out`` below, or,
        # when the whole upright image is the model's input (the client's centre squares),
        # decoded straight into ``out``
        if turn == 1 and crop == (0, 0, *source.size) and (rows, cols) == out.shape[:2]:
            if into_row and out.flags.c_contiguous:
                source.into(out)
                return replace(info, row="into")
            info = replace(info, row="copy")
        pixels = source.crop(crop)
    else:  # the whole image as it is (RGBX stays RGBX: _rgb packs it), or a part of it
        pixels = _rgb(image if crop == (0, 0, *image.size) else image.crop(crop))
    pixels = orientation.upright(pixels, turn)
    if (rows, cols) == (options.size, options.size):
        out[...] = pixels
    else:  # longest: centred on the fill colour, as CenterCropOrPad pads
        out[...] = options.fill_color
        top_pad, left_pad = (options.size - rows) // 2, (options.size - cols) // 2
        out[top_pad : top_pad + rows, left_pad : left_pad + cols] = pixels
    return info


def _geometry(
    width: int, height: int, options: DecodeOptions
) -> tuple[orientation.Box, tuple[int, int]]:
    """The source box (on the full-size upright image) and the (width, height) it becomes, as
    open_clip's inference transform computes them, its rounding included."""
    size, full = options.size, (0.0, 0.0, float(width), float(height))
    if options.variant == "immich":
        return _immich_geometry(width, height, size), (size, size)
    new_w, new_h = resized_size(width, height, size, options.resize_mode)
    if options.resize_mode != "shortest":  # squash, or longest: padded after
        return full, (new_w, new_h)
    # then CenterCrop
    left, top = round((new_w - size) / 2), round((new_h - size) / 2)
    sx, sy = width / new_w, height / new_h
    return (left * sx, top * sy, (left + size) * sx, (top + size) * sy), (size, size)


def resized_size(width: int, height: int, size: int, mode: ResizeMode) -> tuple[int, int]:
    """The (width, height) open_clip's resize makes of a ``width`` x ``height`` image, before
    its centre crop (``shortest``) or pad (``longest``): an image already this size is only
    cropped or padded here, never resampled (what the client's compact uploads are sized to)."""
    if mode == "squash":
        return size, size
    if mode == "longest":  # ResizeKeepRatio(longest=1)
        ratio = max(width, height) / size
        return round(width / ratio), round(height / ratio)
    # Resize(size) on the short side: torchvision truncates the long one
    if width <= height:
        return size, int(size * height / width)
    return int(size * width / height), size


def _immich_geometry(width: int, height: int, size: int) -> orientation.Box:
    """Immich's ``resize_pil`` (short side to ``size``, the other ``int(ratio * size)``) then
    ``crop_pil`` (offsets ``int(side / 2 - size / 2)``), as a box on the source image."""
    if width < height:
        new_w, new_h = size, int((height / width) * size)
    else:
        new_w, new_h = int((width / height) * size), size
    left, top = int(new_w / 2 - size / 2), int(new_h / 2 - size / 2)
    sx, sy = width / new_w, height / new_h
    return left * sx, top * sy, (left + size) * sx, (top + size) * sy


def _rgb(image: Image.Image) -> np.ndarray:
    """RGBX or RGB in, packed RGB ``[h, w, 3]`` out, in one copy."""
    width, height = image.size
    return np.frombuffer(image.tobytes("raw", "RGB"), np.uint8).reshape(height, width, 3)


def _check_cost(width: int, height: int, peak_bytes: int, options: DecodeOptions) -> None:
    """Refuse before decoding: too many pixels, or more decoder memory than the budget (the
    same check admission makes when it prices the header, imaging/work.py)."""
    work.check_budget(width, height, peak_bytes, options.plan)


@dataclass(frozen=True)
class _Jpeg:
    """A walked JPEG whose cost was checked: decoded when the caller knows in which layout."""

    data: bytes
    layout: jpeg.JpegLayout
    target: int
    long_side: bool
    full_size: bool
    #: (width, height) the decode makes (``ceil(side / divisor)``: libjpeg's scaled size)
    size: tuple[int, int]

    def _decode(self, *, rgbx: bool) -> np.ndarray:
        try:
            return jpeg.decode(self.data, self.layout, self.target, rgbx=rgbx,
                               long_side=self.long_side, full_size=self.full_size)  # fmt: skip
        except jpeg.JpegError as exc:
            raise InvalidImage(str(exc)) from exc

    def image(self) -> Image.Image:
        """The decoded image for Pillow to resize: RGBX, its own layout for RGB, which it maps
        without a copy."""
        rgbx = self._decode(rgbx=True)
        height, width = rgbx.shape[:2]
        return Image.frombuffer("RGBX", (width, height), rgbx, "raw", "RGBX", 0, 1)

    def crop(self, box: tuple[int, int, int, int]) -> np.ndarray:
        """``box`` (left, top, right, bottom) of the decoded image, packed RGB (a view)."""
        rgb = self._checked(self._decode(rgbx=False))
        left, top, right, bottom = box
        return rgb[top:bottom, left:right]

    def into(self, out: np.ndarray) -> None:
        """The whole decoded image, packed RGB, written into ``out`` (C-contiguous, its shape)
        by libjpeg itself: no array of its own, no copy. A decode that fails part-way leaves
        ``out`` part-written: the caller's item is then an error, its row not used."""
        try:
            rgb = jpeg.decode(self.data, self.layout, self.target, long_side=self.long_side,
                              full_size=self.full_size, out=out)  # fmt: skip
        except jpeg.JpegError as exc:
            raise InvalidImage(str(exc)) from exc
        self._checked(rgb)

    def _checked(self, rgb: np.ndarray) -> np.ndarray:
        if rgb.shape[:2] != (self.size[1], self.size[0]):  # libjpeg scales as the header says
            raise InvalidImage(
                f"JPEG decoded to {rgb.shape[1]}x{rgb.shape[0]}, not the "
                f"{self.size[0]}x{self.size[1]} its header gives at this scale"
            )
        return rgb


def _jpeg(
    data: bytes, options: DecodeOptions, priced: work.Work | None
) -> tuple[_Jpeg, int, Decoded]:
    # Immich's server decodes every pixel: so does its mode here, or its embeddings would not
    # be Immich's (a DCT-scaled decode moved pixels by up to 42/255, cosine 0.99991)
    dc_only = options.progressive_dc_only and options.variant != "immich"
    long_side = options.resize_mode == "longest"
    full_size = options.variant == "immich"
    layout = priced.layout if priced is not None else None
    if layout is None or (dc_only and layout.progressive and not full_size
                          and jpeg.scale_divisor(layout.width, layout.height, options.size,
                                                 long_side=long_side) == 8):  # fmt: skip
        # not walked whole for its price, or a progressive file decoded at 1/8 from the DC-only
        # stream, which only a walk that keeps it makes
        priced = None
        try:
            layout = jpeg.walk(
                data,
                max_scans=options.max_scans,
                dc_only_for=options.size if dc_only else None,
                long_side=long_side,
            )
        except jpeg.UnsupportedJpeg as exc:
            raise UnsupportedFormat(str(exc)) from exc
        except jpeg.JpegError as exc:
            raise InvalidImage(str(exc)) from exc
    width, height = layout.width, layout.height
    divisor = 1 if full_size else jpeg.scale_divisor(width, height, options.size,
                                                     long_side=long_side)  # fmt: skip
    scaled = math.ceil(width / divisor) * math.ceil(height / divisor)
    # the coefficient buffer and the decoded RGBX array (Pillow maps it without a copy)
    _check_cost(width, height, layout.coefficient_bytes + scaled * 4 + DECODER_OVERHEAD, options)
    decoded_scans = layout.dc_scans if layout.dc_only is not None else layout.scans
    # one scan visits each block once: within the pixel limit that is always far below the cap
    if decoded_scans > 1 and layout.blocks * decoded_scans > MAX_BLOCK_VISITS:
        raise ImageTooLarge(
            f"image is {width}x{height} with {layout.scans} scans: decoding it would visit "
            f"{layout.blocks * decoded_scans} blocks, over the limit of {MAX_BLOCK_VISITS}",
            width=width,
            height=height,
        )
    turn = orientation.from_tiff(data, *layout.exif) if layout.exif else 1
    if priced is None:
        coding = work.jpeg_coding(layout.progressive, layout.arithmetic)
        priced = work.Work("jpeg", coding, work.jpeg_seconds(layout, coding, len(data),
                                                             options.plan))  # fmt: skip
    info = Decoded("jpeg", layout.width, layout.height, scaled, len(data), priced)
    size = (math.ceil(width / divisor), math.ceil(height / divisor))
    return _Jpeg(data, layout, options.size, long_side, full_size, size), turn, info


_CONTAINERS = {"png": containers.png, "webp": containers.webp, "gif": containers.gif}


def _pillow(data: bytes, kind: str, options: DecodeOptions) -> tuple[Image.Image, int, Decoded]:
    try:
        header = _CONTAINERS[kind](data)
    except containers.ContainerError as exc:
        raise InvalidImage(f"unreadable {kind} header: {exc}") from exc
    width, height = header.width, header.height
    peak = width * height * header.bytes_per_pixel + DECODER_OVERHEAD
    _check_cost(width, height, peak, options)
    if not paths.pillow_reads(kind):  # pillow-simd built without libwebp: not the sender's fault
        raise UnsupportedFormat(f"{kind} images cannot be decoded by this server (its Pillow was "
                                f"built without {kind}); send JPEG or PNG")  # fmt: skip
    try:
        image = Image.open(io.BytesIO(data), formats=[kind.upper()])
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageTooLarge(str(exc)) from exc
    except UnidentifiedImageError as exc:  # its message names a BytesIO object, not the file
        raise InvalidImage(f"cannot read {kind} header: damaged or not a {kind} file") from exc
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
    price = work.price(header.coding, width * height, len(data), options.plan, (width, height))
    return rgb, turn, Decoded(kind, width, height, width * height, len(data), price)


def _resize_box(
    image: Image.Image,
    size: tuple[int, int],
    box: orientation.Box,
    interpolation: Interpolation,
    *,
    reduce: bool,
) -> Image.Image:
    """Antialiased resize of ``box`` to ``size``, as a resize of the whole image followed by a
    crop would compute it (Pillow's box maps coordinates; its filters read past the box). A box
    pre-reduction when the source is over 3x the target (PNG/WebP/GIF: no DCT scaling), unless
    ``reduce`` is off (Immich resizes in one step). Only for a box that is no plain crop
    (``_crop``: the caller takes those without resampling)."""
    source = min(box[2] - box[0], box[3] - box[1])
    return image.resize(
        size,
        _RESAMPLING[interpolation],
        box=box,
        reducing_gap=3.0 if reduce and source > 3 * min(size) else None,
    )


def _crop(size: tuple[int, int], box: orientation.Box) -> tuple[int, int, int, int] | None:
    """``box`` as integer (left, top, right, bottom) when resizing it to ``size`` is a plain
    crop (the box is that size, on whole pixels), else None."""
    if box[2] - box[0] != size[0] or box[3] - box[1] != size[1]:
        return None
    if not all(float(edge).is_integer() for edge in box):
        return None
    left, top, right, bottom = (int(edge) for edge in box)
    return left, top, right, bottom
