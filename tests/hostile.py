"""Hostile inputs, built by the tests: the smallest bytes that would cost a decoder the most.

Each maker returns bytes of a few KB at most. What they would have cost before the gateway
bounded its decoders (measured on the 2-core machine, issue 14): the lossless WebP with huge
declared dimensions grew the process by ~1.5 GB; the EXIF IFD bombs made Pillow's IFD loader
allocate the same bytes thousands of times (~900 MB for eight PNGs).
"""

from __future__ import annotations

import base64
import struct
import zlib
from collections.abc import Callable

from PIL import Image

from tests import samples


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def ifd_bomb(entries: int = 4000, payload: int = 16_000, orientation_last: bool = True) -> bytes:
    """A TIFF block whose IFD0 has thousands of entries that all point at the same large
    payload (Pillow's loader reads each one), with the orientation tag last."""
    count = entries + (1 if orientation_last else 0)
    data_offset = 8 + 2 + 12 * count + 4
    ifd = struct.pack("<H", count)
    for i in range(entries):
        ifd += struct.pack("<HHII", 0x9000 + i % 0x6000, 7, payload, data_offset)  # UNDEFINED
    if orientation_last:
        ifd += struct.pack("<HHIHH", 0x0112, 3, 1, 6, 0)
    return b"II*\x00" + struct.pack("<I", 8) + ifd + struct.pack("<I", 0) + b"\x00" * payload


def png_exif_bomb() -> bytes:
    png = samples.png(0)
    iend = png.rindex(b"IEND") - 4
    return png[:iend] + _chunk(b"eXIf", ifd_bomb()) + png[iend:]


def jpeg_exif_bomb() -> bytes:
    """The same bomb inside a JPEG's APP1 (under its 64 KB segment limit)."""
    block = b"Exif\x00\x00" + ifd_bomb(entries=4000, payload=12_000)
    assert len(block) < 65_000
    jpeg = samples.compact(0)
    return jpeg[:2] + b"\xff\xe1" + struct.pack(">H", len(block) + 2) + block + jpeg[2:]


def webp_huge_canvas(width: int = 9000, height: int = 9000) -> bytes:
    """A lossless WebP under 1 KB whose header declares ``width`` x ``height``."""
    webp = bytearray(samples.encode(samples.small_photo(0, (64, 48)), "WEBP", lossless=True))
    at = webp.index(b"VP8L") + 8 + 1  # after the chunk header and the 0x2f signature
    bits = int.from_bytes(webp[at : at + 4], "little")
    bits = (bits & ~0x0FFFFFFF) | (width - 1) | ((height - 1) << 14)
    webp[at : at + 4] = bits.to_bytes(4, "little")
    return bytes(webp)


def png_huge(width: int = 9000, height: int = 9000) -> bytes:
    png = bytearray(samples.png(0))
    png[16:24] = struct.pack(">II", width, height)
    png[29:33] = struct.pack(">I", zlib.crc32(bytes(png[12:29])))
    return bytes(png)


def png_many_chunks(chunks: int = 60_000) -> bytes:
    """Tiny text chunks before the image data: Pillow reads each in Python."""
    png = samples.png(0)
    idat = png.index(b"IDAT") - 4
    return png[:idat] + _chunk(b"tEXt", b"k\x00v") * chunks + png[idat:]


def gif_huge_screen() -> bytes:
    gif = bytearray(samples.gif(0))
    gif[6:10] = struct.pack("<HH", 9500, 9500)
    return bytes(gif)


def jpeg_progressive_huge(width: int = 9000, height: int = 9000) -> bytes:
    """A progressive JPEG whose frame header claims ``width`` x ``height`` at 4:4:4: decoding
    would need the whole image's coefficients (~730 MB) before the first scan."""
    data = bytearray(samples.progressive_jpeg(0, (640, 480)))
    sof = data.index(b"\xff\xc2")
    data[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    for i in range(data[sof + 9]):
        data[sof + 11 + 3 * i] = 0x11  # every component at full resolution
    return bytes(data)


def jpeg_many_scans(scans: int = 300) -> bytes:
    data = samples.progressive_jpeg(1, (800, 600))
    first = data.index(b"\xff\xda")
    second = data.index(b"\xff\xda", first + 2)
    return data[:second] + data[first:second] * scans + data[second:]


def jpeg_many_segments(segments: int = 20_000) -> bytes:
    jpeg = samples.compact(0)
    return jpeg[:2] + b"\xff\xfe\x00\x03x" * segments + jpeg[2:]


IMAGES: dict[str, Callable[[], bytes]] = {
    "webp-huge-canvas": webp_huge_canvas,
    "png-huge": png_huge,
    "png-exif-ifd-bomb": png_exif_bomb,
    "png-many-chunks": png_many_chunks,
    "gif-huge-screen": gif_huge_screen,
    "jpeg-exif-ifd-bomb": jpeg_exif_bomb,
    "jpeg-progressive-huge": jpeg_progressive_huge,
    "jpeg-many-scans": jpeg_many_scans,
    "jpeg-many-segments": jpeg_many_segments,
}
#: Classes whose bytes are a valid, decodable image once the bomb is defused (the EXIF bombs):
#: the gateway must embed them (200), ignoring the orientation it will not dig for.
DECODABLE = {"png-exif-ifd-bomb", "jpeg-exif-ifd-bomb"}


def json_many_items(count: int = 2_000_000) -> bytes:
    return b'{"input": [' + b",".join([b'"QUJD"'] * count) + b"]}"


def json_huge_string(chars: int = 60_000_000) -> bytes:
    return b'{"input": ["' + b"A" * chars + b'"]}'


def json_deep(depth: int = 100_000) -> bytes:
    return b'{"input": ' + b"[" * depth + b"]" * depth + b"}"


# --- work amplification: a few hundred bytes that decode to tens of megapixels (issue 23) -------


def webp_flat_lossless(width: int = 3800, height: int = 3800) -> bytes:
    """A real lossless WebP of a flat canvas: ~500 bytes, 14 MP, ~0.13 CPU-s to decode (within
    every per-image budget: its cost is only visible to admission in bulk)."""
    return samples.encode(Image.new("RGB", (width, height), (120, 130, 140)), "WEBP", lossless=True)


#: ``jpegtran -arithmetic`` (libjpeg-turbo 2.1) of Pillow's baseline JPEG of a flat 10000 x 10000
#: canvas: 211 bytes for 100 MP (the pixel limit). libjpeg-turbo decodes it (1/8 scale: ~26 ms).
JPEG_ARITHMETIC_100MP = base64.b64decode(
    "/9j/4AAQSkZJRgABAQAAAQABAAD/2wBDAAgGBgcGBQgHBwcJCQgKDBQNDAsLDBkSEw8UHRofHh0aHBwgJC4nICIsIxwc"
    "KDcpLDAxNDQ0Hyc5PTgyPC4zNDL/2wBDAQkJCQwLDBgNDRgyIRwhMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIyMjIy"
    "MjIyMjIyMjIyMjIyMjIyMjIyMjL/yQARCCcQJxADASIAAhEBAxEB/8wACgAQEAUBEBEF/9oADAMBAAIRAxEAPwAqZyGw"
    "kVD/2Q=="
)


def jpeg_arithmetic() -> bytes:
    return JPEG_ARITHMETIC_100MP


def png_text_bomb(chunks: int = 70) -> bytes:
    """zTXt chunks of ~1 KB that inflate to 1 MB each: Pillow allocates 64 MB of text before it
    refuses the image (422). In bursts these once kept the gateway at +1.5 GB."""
    png = samples.png(0)
    idat = png.index(b"IDAT") - 4
    text = _chunk(b"zTXt", b"k\x00\x00" + zlib.compress(b"\x00" * ((1 << 20) - 16), 9))
    return png[:idat] + text * chunks + png[idat:]


# --- issue 31: classes priced at a fraction of their decode before the plan was priced --------

#: ``jpegtran -arithmetic -progressive`` (libjpeg-turbo 2.1) of Pillow's progressive JPEG of a
#: flat 224 x 40,000 and 1000 x 40,000 canvas, zlib-compressed: no 1/8 scale (the short side
#: is near the target), so every scan is decoded over full-size coefficients.
_ARITHMETIC_PROGRESSIVE = {
    (224, 40_000): (
        "eNrt3UtKA0EQxvGqGTMPZ4I9mkUME/NQiEIIOg6ooIwgBHTnPVx5AE/iNhcInkI9gI9NIBtv0U4wGIkrl8K/+7f6mqru"
        "PkHZFzsRczW8HIqqiJZb7LtcSOB5vlcJfN8Pw2A1rlXjKIo31zfWas1Ga6vZSNP2zqDX7va303T3aK+/f5Dneat3cnac"
        "nQ4O82zWRMMwjKO4Xq3Ws07ayf687KMkwf25TFztipOom6h9Fk+MGvsmsaviGNeUz74d39TLkxVTKfOg/IlWnNF0liRf"
        "iata6OjjR+Isku8qr5hXLfoUnTKZ3yWuiJjru/FTHwAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAADw"
        "fz0szbcxv+bbmKX5NrNkal8/ATahFvo="
    ),
    (1000, 40_000): (
        "eNrtz09qE1EcwPHfm2mSGTPBGe0ilqltqlCFUGoMqKBEEAq68x6uPIAncdsLFE+hPUCtm0I33mKcErHqzq183vusvo/3"
        "rzvrLqJ+c/T6KFKKSP2M7lu8imI4HA0HxWg0KsviRrU5qcbj6s6t2zc3t7d27m5vte3u/YP93b35vbZ98OTh/PDRcrnc"
        "2X/24uni+cHj5eLqkFSWZTWuppPJdDFrZ4t/Ht3naIqPL/PvedqLrEl5k7rTGEad6u48qjxFVud1/+z3J++m/cpGPeh7"
        "0f8kDbLjy6vSrEue0ir9UbLr8mvXcJX9VdJq1pefd0UeEfXbDydf5gAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
        "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
        "AAAAAAAAAAAAAAAAAAAAAPyXPnWnsdEMuvMoUp7Sqj6+/K1k16VelxTr8vUHZ1+81A=="
    ),
}


def jpeg_arithmetic_progressive(size: tuple[int, int] = (1000, 40_000)) -> bytes:
    """An arithmetic-coded progressive JPEG of a flat canvas (26 KB for 9 MP, 118 KB for 40 MP)."""
    return zlib.decompress(base64.b64decode(_ARITHMETIC_PROGRESSIVE[size]))


def jpeg_progressive_strip(width: int = 224, height: int = 40_000) -> bytes:
    """A flat progressive strip (Pillow's 10-scan script, 4:2:0): decoded at full size."""
    return samples.encode(Image.new("RGB", (width, height), (90, 120, 150)), "JPEG",
                          progressive=True)  # fmt: skip


#: Many of one image in one request: cheap bytes, expensive decodes. (name -> maker, count)
BULK: dict[str, tuple[Callable[[], bytes], int]] = {
    "webp-flat-lossless-x100": (webp_flat_lossless, 100),
    "webp-flat-lossless-x256": (webp_flat_lossless, 256),
    "jpeg-arithmetic-bulk": (jpeg_arithmetic, 200),
    "png-text-bomb-bulk": (png_text_bomb, 8),
    # issue 31: as many as the 64 MiB body allows, under every per-image limit
    "jpeg-progressive-strip-bulk": (jpeg_progressive_strip, 256),
    "jpeg-arithmetic-progressive-bulk": (jpeg_arithmetic_progressive, 256),
}


BODIES: dict[str, Callable[[], bytes]] = {
    "json-many-items": json_many_items,
    "json-huge-string": json_huge_string,
    "json-deep": json_deep,
}
