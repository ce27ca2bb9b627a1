"""What decoding an image will cost, read from its header before anything is decoded, for the
decode plan that will run (the target size, the resize, whether the DCT may scale).

Encoded bytes say little about decode work: a lossless WebP of a flat 30 MP canvas is a few
hundred bytes and costs ~0.3 CPU-seconds, an arithmetic-coded 100 MP JPEG is 211 bytes. The
factors below are CPU seconds on one core of the 2-CPU development machine (Pillow 11 /
libjpeg-turbo via simplejpeg, decode + resize to 224 px, thread CPU time, best of 3;
``python -m bench decode-factors``, docs/ADMISSION.md has the table); admission learns, per
format and coding, how far this machine is from them (pipeline/admission.py), and meters what
each request really spends.

PNG, WebP and GIF decode every source pixel: source pixels times a per-coding factor, plus the
encoded bytes times a per-coding factor (entropy decoding scales with the bits, which is where
a camera photo's time goes). A JPEG is priced as imaging/jpeg.py will decode it:

- the coefficient pass, per 8x8 block of all components and per scan decoded. libjpeg walks
  every block of every scan at full resolution whatever the output scale; only a progressive
  file decoded at 1/8 skips its AC scans (the DC-only stream). Arithmetic coding costs more per
  block than Huffman, progressive more than sequential, each measured on its own files;
- the output, per pixel at the DCT scale the decoder picks: none when the short side (long
  side, ``longest``) is already near the target, so a 224 x 40,000 strip outputs 9 MP;
- the resize, per pixel of the decoded image the resize reads (nothing for a plain crop);
- the encoded bytes, per coding.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace

from clip_gateway.errors import ImageTooLarge
from clip_gateway.imaging import containers, jpeg

MiB = 1 << 20
#: CPU seconds per source pixel and per encoded byte, by format and coding (PNG, WebP, GIF), or
#: for a JPEG coding per block and scan decoded and per encoded byte (measured, see above).
#: PNG's 16-bit and interlaced factors are the 8-bit one scaled by the work they add (twice the
#: bytes to unfilter; seven passes): priors that the learned rate corrects.
FACTORS: dict[str, tuple[float, float]] = {
    "jpeg-baseline": (18e-9, 12e-9),
    "jpeg-progressive": (14e-9, 38e-9),
    "jpeg-arithmetic": (25e-9, 133e-9),
    "jpeg-arithmetic-progressive": (16e-9, 153e-9),
    "png": (10e-9, 3e-9),
    "png-16bit": (20e-9, 3e-9),
    "png-interlaced": (13e-9, 3e-9),
    "webp-lossy": (9.6e-9, 31e-9),
    "webp-lossless": (8.5e-9, 5.5e-9),
    "gif": (4.5e-9, 5.8e-9),
}
#: JPEG: CPU seconds per pixel output at the decoded scale (inverse DCT, upsampling, colour).
JPEG_OUTPUT_S_PER_PIXEL = 1.1e-9
#: CPU seconds per decoded pixel the resize reads (Pillow's antialiased filter over its box).
RESIZE_S_PER_PIXEL = 0.9e-9
#: Scans assumed for a progressive JPEG whose scans lie beyond the prefix read (libjpeg's
#: default script for three components; six for one), and of those the DC scans (the first
#: pass and its refinement, the seventh scan: a camera's 3 MB file has it beyond the prefix, and
#: without it a 12 MP photo's DC-only decode was priced at half its cost, issue 42).
STANDARD_SCANS = 10
STANDARD_DC_SCANS = 2
#: A base64 item is decoded this far to read its header (a JPEG's frame header follows its
#: APP segments: EXIF and ICC profiles, rarely over a few hundred KB); a JPEG's scans are
#: counted this far too (the walk is bounded: ``jpeg.MAX_SEGMENTS``, compiled regex skips).
HEADER_PREFIX = 1 << 20
#: libjpeg's and zlib's own working memory (tables, row buffers), on top of the image buffers.
DECODER_OVERHEAD = 1 * MiB


@dataclass(frozen=True)
class Plan:
    """What decides an image's decode beyond its header: the target, the resize, whether the
    DCT may scale, and the limits the decoder enforces (imaging/preprocess.py's options)."""

    size: int = 224
    resize_mode: str = "shortest"
    #: Every pixel, resized in one step (Immich's /predict): no DCT scaling, no pre-reduction.
    full_size: bool = False
    #: A progressive JPEG decoded at 1/8 runs its DC scans alone.
    dc_only: bool = True
    max_pixels: int = 100_000_000
    max_decode_bytes: int = 256 * MiB
    max_scans: int = 256


DEFAULT_PLAN = Plan()


@dataclass(frozen=True)
class Work:
    """One image's decode price: ``format`` (``jpeg``, ``png``, ``webp``, ``gif``, or ``other``
    for anything the decoder will refuse in a few microseconds), its coding, and the CPU
    seconds it costs at the factors above."""

    format: str
    coding: str
    seconds: float
    #: A JPEG's structure as the pricing walk read it, when that walk read the whole file: the
    #: decoder takes it instead of walking the same bytes again (imaging/preprocess.py).
    layout: jpeg.JpegLayout | None = field(default=None, compare=False, repr=False)


#: An image the decoder refuses from its first bytes (unknown or unsupported format, unreadable
#: header, over the pixel or memory budget): priced at nothing beyond the per-item overhead.
REFUSED = Work("other", "refused", 0.0)


#: Pixels assumed for an image whose header lies beyond the prefix read (the default pixel limit).
WORST_PIXELS = 100_000_000


def check_budget(width: int, height: int, peak_bytes: int, plan: Plan) -> None:
    """Refuse before decoding: more pixels, or more decoder memory, than the plan allows."""
    if width * height > plan.max_pixels:
        raise ImageTooLarge(
            f"image is {width}x{height} ({width * height} pixels); the limit is "
            f"{plan.max_pixels} pixels",
            limit=plan.max_pixels,
            width=width,
            height=height,
        )
    if peak_bytes > plan.max_decode_bytes:
        raise ImageTooLarge(
            f"image is {width}x{height}: decoding it needs about "
            f"{math.ceil(peak_bytes / MiB)} MiB, over the {plan.max_decode_bytes // MiB} MiB "
            "budget per image",
            limit=plan.max_decode_bytes,
            width=width,
            height=height,
        )


def worst(data: bytes, encoded_bytes: int, plan: Plan = DEFAULT_PLAN) -> Work:
    """The price of an item whose header was not within its first ``HEADER_PREFIX`` bytes: a real
    file never puts that much before its frame, so it is priced at the pixel limit in the dearest
    coding of its format (or as refused, when no accepted format's signature starts it)."""
    side = math.isqrt(WORST_PIXELS)
    if data.startswith(b"\xff\xd8\xff"):
        layout = jpeg.JpegLayout(side, side, ((1, 1),) * 3, True, STANDARD_SCANS,
                                 STANDARD_DC_SCANS, True, None)  # fmt: skip
        return Work("jpeg", "jpeg-progressive", jpeg_seconds(layout, "jpeg-progressive",
                                                             encoded_bytes, plan))  # fmt: skip
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return price("png-16bit", WORST_PIXELS, encoded_bytes, plan, (side, side))
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return price("webp-lossy", WORST_PIXELS, encoded_bytes, plan, (side, side))
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return price("gif", WORST_PIXELS, encoded_bytes, plan, (side, side))
    return REFUSED


def jpeg_coding(progressive: bool, arithmetic: bool) -> str:
    if arithmetic:
        return "jpeg-arithmetic-progressive" if progressive else "jpeg-arithmetic"
    return "jpeg-progressive" if progressive else "jpeg-baseline"


def price(
    coding: str,
    pixels: int,
    encoded_bytes: int,
    plan: Plan = DEFAULT_PLAN,
    size: tuple[int, int] | None = None,
) -> Work:
    """A PNG, WebP or GIF: every source pixel decoded, plus (Immich's plan, resized in one
    step with no pre-reduction) the resize over the box it reads."""
    per_pixel, per_byte = FACTORS[coding]
    seconds = per_pixel * pixels + per_byte * encoded_bytes
    if plan.full_size and size is not None:
        seconds += RESIZE_S_PER_PIXEL * resize_pixels(*size, plan)
    return Work(coding.split("-")[0], coding, seconds)


def scale(width: int, height: int, plan: Plan) -> int:
    """The DCT scale divisor the decoder picks for this frame under ``plan``."""
    if plan.full_size:
        return 1
    return jpeg.scale_divisor(width, height, plan.size, long_side=plan.resize_mode == "longest")


def resize_pixels(width: int, height: int, plan: Plan) -> int:
    """Pixels of a ``width`` x ``height`` decoded image the resize reads: the centre square of
    the short side (``shortest``, Immich), the whole image otherwise; none when it is a plain
    crop (already the target on the side that matters)."""
    short = min(width, height)
    if plan.resize_mode == "shortest" or plan.full_size:
        return 0 if short == plan.size and not plan.full_size else short * short
    if max(width, height) == plan.size and plan.resize_mode == "longest":
        return 0
    return width * height


def jpeg_seconds(layout: jpeg.JpegLayout, coding: str, encoded_bytes: int, plan: Plan) -> float:
    """A JPEG's price under ``plan``: coefficient passes at full resolution, output at the
    decoded scale, the resize that follows, the entropy-coded bytes."""
    fixed, share, _ = _jpeg_shape(_shape_of(layout), coding, plan, _factors(coding))
    decoded_bytes = float(encoded_bytes)
    if share is not None:  # the DC-only stream: its share of the scans' bytes
        decoded_bytes *= share
    return fixed + FACTORS[coding][1] * decoded_bytes


def jpeg_peak_bytes(layout: jpeg.JpegLayout, plan: Plan) -> int:
    """libjpeg's coefficient buffer and the decoded RGBX array (Pillow maps it, no copy)."""
    return _jpeg_shape(_shape_of(layout), "jpeg-baseline", plan, _factors("jpeg-baseline"))[2]


def _factors(coding: str) -> tuple[float, float, float]:
    """The factors a JPEG's fixed part is priced with, part of its cache key: a price follows
    the factors it is computed with, even once they change (a test's, or a slower machine's)."""
    return FACTORS[coding][0], JPEG_OUTPUT_S_PER_PIXEL, RESIZE_S_PER_PIXEL


_Shape = tuple[int, int, tuple[tuple[int, int], ...], bool, bool, int, int]


def _shape_of(layout: jpeg.JpegLayout) -> _Shape:
    """What a JPEG's price depends on besides its bytes (its frame and scans)."""
    return (layout.width, layout.height, layout.sampling, layout.progressive,
            layout.multi_scan, layout.scans, layout.dc_scans)  # fmt: skip


@functools.lru_cache(maxsize=4096)
def _jpeg_shape(
    shape: _Shape, coding: str, plan: Plan, factors: tuple[float, float, float]
) -> tuple[float, float | None, int]:
    """The part of a JPEG's price its bytes do not change (passes over its blocks, output and
    resize), the share of its bytes decoded (None: all), and the decoder's peak memory: one
    computation per frame shape and plan (every image is priced on the event loop, and most
    share a few shapes)."""
    width, height, sampling, progressive, multi_scan, scans, dc_scans = shape
    layout = jpeg.JpegLayout(width, height, sampling, progressive, scans, dc_scans, multi_scan,
                             None)  # fmt: skip
    per_block, per_output_pixel, per_resized_pixel = factors
    divisor = scale(width, height, plan)
    share = None
    if not progressive:
        passes = 1  # sequential: every block decoded once, whatever its scans
    elif plan.dc_only and not plan.full_size and divisor == 8:
        passes = max(1, dc_scans)  # the DC-only stream: its share of the scans' bytes
        share = passes / max(passes, scans)
    else:
        passes = max(1, scans)
    out_width, out_height = -(-width // divisor), -(-height // divisor)
    fixed = (
        per_block * layout.blocks * passes
        + per_output_pixel * out_width * out_height
        + per_resized_pixel * resize_pixels(out_width, out_height, plan)
    )
    peak = layout.coefficient_bytes + out_width * out_height * 4 + DECODER_OVERHEAD
    return fixed, share, peak


def estimate(data: bytes, encoded_bytes: int | None = None, plan: Plan = DEFAULT_PLAN) -> Work:
    """The price of ``data`` (or of its first bytes, with the whole item ``encoded_bytes``
    long) under ``plan``, from the same header readers the decoder trusts. An image the decoder
    will refuse from its header (no header, over the pixel or memory budget) is ``REFUSED``:
    it costs nothing, so a 45-byte header declaring gigapixels buys nothing."""
    size = len(data) if encoded_bytes is None else encoded_bytes
    try:
        if data.startswith(b"\xff\xd8\xff"):
            return _jpeg(data, size, plan)
        coding, width, height, peak = _container(data)
        check_budget(width, height, peak, plan)
    except (ValueError, IndexError, ImageTooLarge):
        return REFUSED  # the decoder refuses it before any work
    return price(coding, width * height, size, plan, (width, height))


def _jpeg(data: bytes, size: int, plan: Plan) -> Work:
    whole = len(data) <= HEADER_PREFIX
    try:
        layout = jpeg.walk(data if whole else data[:HEADER_PREFIX], max_scans=plan.max_scans)
    except jpeg.JpegError:
        if whole:
            raise
        layout = jpeg.frame_layout(data)  # a frame header further in: its scans are not read
        whole = False
    if layout.progressive and not whole:
        # scans beyond the prefix are not counted: at least the standard script's
        layout = replace(layout, scans=max(layout.scans, STANDARD_SCANS),
                         dc_scans=max(layout.dc_scans, STANDARD_DC_SCANS))  # fmt: skip
    check_budget(layout.width, layout.height, jpeg_peak_bytes(layout, plan), plan)
    coding = jpeg_coding(layout.progressive, layout.arithmetic)
    seconds = jpeg_seconds(layout, coding, size, plan)
    # the walk read every byte the decoder will (``size`` is the whole item): it may reuse it
    return Work("jpeg", coding, seconds, layout if whole and size == len(data) else None)


def _container(data: bytes) -> tuple[str, int, int, int]:
    """(coding, width, height, decoder peak bytes) of a PNG, WebP or GIF; ValueError when
    there is no header to read."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        info = containers.png_header(data)
    elif data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        info = containers.webp(data)
    elif data[:6] in (b"GIF87a", b"GIF89a"):
        info = containers.gif(data)
    else:
        raise ValueError("not an accepted image format")
    peak = info.width * info.height * info.bytes_per_pixel + DECODER_OVERHEAD
    return info.coding, info.width, info.height, peak
