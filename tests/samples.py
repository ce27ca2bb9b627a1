"""Image bytes for tests: every format and oddity the gateway must handle, built on the fly."""

from __future__ import annotations

import io
from functools import cache

from PIL import Image

from bench.harness.photos import compact_jpeg, jpeg, photo


@cache
def compact(seed: int = 0) -> bytes:
    return compact_jpeg(seed)


def encode(image: Image.Image, fmt: str, **kwargs: object) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **kwargs)
    return buf.getvalue()


@cache
def small_photo(seed: int = 0, size: tuple[int, int] = (640, 480)) -> Image.Image:
    return photo(*size, seed=seed)


def camera_photo(width: int, height: int, seed: int = 0) -> Image.Image:
    """A camera-sized image for tests that need its size, not its sensor noise: ``photo``'s
    scene at a quarter of the size, enlarged (``photo`` itself takes 1-3 CPU-s at 12 MP)."""
    small = photo(max(1, width // 4), max(1, height // 4), seed=seed)
    return small.resize((width, height), Image.Resampling.BICUBIC)


def png(seed: int = 0, mode: str = "RGB") -> bytes:
    return encode(small_photo(seed).convert(mode), "PNG")


def webp(seed: int = 0) -> bytes:
    return encode(small_photo(seed), "WEBP", quality=85)


def gif(seed: int = 0) -> bytes:
    return encode(small_photo(seed).convert("P"), "GIF")


def bmp(seed: int = 0) -> bytes:
    """A format the gateway recognises but does not accept (415)."""
    return encode(small_photo(seed), "BMP")


def grayscale_jpeg(seed: int = 0) -> bytes:
    return jpeg(small_photo(seed).convert("L"))


def cmyk_jpeg(seed: int = 0) -> bytes:
    return encode(small_photo(seed).convert("CMYK"), "JPEG", quality=90)


@cache
def progressive_jpeg(seed: int = 0, size: tuple[int, int] = (2400, 1800)) -> bytes:
    return jpeg(photo(*size, seed=seed), progressive=True)


def oriented_jpeg(orientation: int, seed: int = 0) -> bytes:
    return jpeg(small_photo(seed, (480, 320)), orientation=orientation)


def claims_pixels(width: int, height: int) -> bytes:
    """A tiny valid JPEG whose SOF0 header is rewritten to claim ``width`` x ``height``."""
    data = bytearray(compact(0))
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 7] = height.to_bytes(2, "big")
    data[sof + 7 : sof + 9] = width.to_bytes(2, "big")
    return bytes(data)


def truncated_jpeg() -> bytes:
    data = compact(1)
    return data[: len(data) // 2]


def corrupt_jpeg() -> bytes:
    """A bogus Huffman table: libjpeg refuses it (garbled scan data alone often decodes)."""
    data = bytearray(compact(2))
    dht = data.index(b"\xff\xc4")
    data[dht + 4] = 0x5F  # table class 5, id 15: invalid
    return bytes(data)
