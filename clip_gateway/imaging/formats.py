"""Image formats told by their first bytes (never a name): the signatures the client and the
server both read (clip_gateway/client/formats.py, imaging/preprocess.py ``sniff``). Imports nothing.
"""

from __future__ import annotations

#: Bytes of a file's start that ``identify`` and ``unsupported`` read (an ``ftyp`` box's
#: compatible brands past them are not read, so the cost is bounded whatever the box claims).
HEAD_BYTES = 64

AVIF_BRANDS = frozenset({b"avif", b"avis"})
HEIF_BRANDS = frozenset({b"heic", b"heix", b"hevc", b"hevx", b"heim", b"heis", b"mif1", b"msf1"})

#: Formats recognised by signature that neither the gateway nor the client reads:
#: (signature, offset, name).
UNSUPPORTED_SIGNATURES: tuple[tuple[bytes, int, str], ...] = (
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


def identify(data: bytes) -> str | None:
    """``jpeg``, ``png``, ``webp``, ``gif``, ``heif`` or ``avif`` from a file's first bytes
    (at most ``HEAD_BYTES`` are read), else None."""
    head = data[:HEAD_BYTES]
    if head.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if head[4:8] == b"ftyp":
        return _iso_brand(head)
    return None


def _iso_brand(head: bytes) -> str | None:
    """AVIF or HEIF from the ``ftyp`` box: the major brand, then the compatible ones
    (``mif1`` alone says "an image file", not which codec)."""
    size = int.from_bytes(head[:4], "big")
    brands = [head[8:12]] + [head[i : i + 4] for i in range(16, min(size, len(head)) - 3, 4)]
    if any(brand in AVIF_BRANDS for brand in brands):
        return "avif"
    if any(brand in HEIF_BRANDS for brand in brands):
        return "heif"
    return None


def unsupported(data: bytes) -> str | None:
    """The name of a known format in ``UNSUPPORTED_SIGNATURES`` (``bmp``, ``tiff``…), else None."""
    for signature, offset, name in UNSUPPORTED_SIGNATURES:
        if data[offset : offset + len(signature)] == signature:
            return name
    return None
