"""Realistic synthetic photos encoded as cameras, phones and Immich do.

The pixels come from ``photo`` (clip_gateway/model/calibration.py, the generator the INT8
calibration set is drawn from): smooth light, objects with edges, texture and sensor noise, landing
where camera JPEGs do (roughly 0.2-0.5 bytes/pixel at q90), so decode timings and byte counts mean
what they would on a real library.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from clip_gateway.model.calibration import photo as photo  # the one generator, re-exported

#: Megapixel sizes of common cameras/phones (width x height, landscape).
CAMERA_SIZES = {
    8: (3264, 2448),
    12: (4032, 3024),
    16: (4608, 3456),
    24: (6000, 4000),
}


def jpeg(
    image: Image.Image,
    quality: int = 90,
    *,
    progressive: bool = False,
    orientation: int | None = None,
    subsampling: int = 2,
) -> bytes:
    """Encode as a camera would: 4:2:0, optional progressive scans and EXIF orientation tag."""
    buf = io.BytesIO()
    kwargs: dict[str, object] = {}
    if orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = orientation
        kwargs["exif"] = exif.tobytes()
    if image.mode == "RGB":
        kwargs["subsampling"] = subsampling
    image.save(buf, "JPEG", quality=quality, progressive=progressive, optimize=True, **kwargs)
    return buf.getvalue()


def arithmetic(data: bytes, *, progressive: bool) -> bytes:
    """A JPEG re-coded with arithmetic coding (lossless: the same coefficients; progressive
    scans when asked, libjpeg's script) by libjpeg-turbo's ``jpegtran``, which Pillow has no
    equivalent of (``apt-get install libjpeg-turbo-progs``); FileNotFoundError without it."""
    tool = shutil.which("jpegtran")
    if tool is None:
        raise FileNotFoundError("jpegtran not found: apt-get install libjpeg-turbo-progs")
    with tempfile.TemporaryDirectory() as tmp:
        source, target = Path(tmp) / "in.jpg", Path(tmp) / "out.jpg"
        source.write_bytes(data)
        mode = ["-progressive"] if progressive else []  # sequential unless told
        subprocess.run([tool, "-arithmetic", *mode, "-outfile", str(target), str(source)],
                       check=True)  # fmt: skip
        return target.read_bytes()


def compact_jpeg(seed: int = 0, short_side: int = 256, quality: int = 85) -> bytes:
    """A compact JPEG of 256 px short side, 4:2:0: what the client uploaded for a 224-px model
    before it sized uploads to the model's input (clip_gateway/client/compact.py), and what
    other clients that shrink before sending do; the gateway resizes it."""
    long_side = short_side * 4 // 3
    return jpeg(photo(long_side, short_side, seed), quality)


@dataclass(frozen=True)
class Sample:
    name: str
    data: bytes
    megapixels: float


#: Immich's preview: the short side at most 1440 px (its default ``preview.size``), JPEG
#: quality 80 (or WebP); what its server sends to the ML service for smart search.
IMMICH_PREVIEW_SIDE = 1440
#: (width, height) of the originals behind the previews: camera and phone landscape and
#: portrait, square, a panorama, a screenshot, and photos already smaller than a preview.
IMMICH_ORIGINALS = (
    (4032, 3024), (3024, 4032), (3000, 3000), (6000, 2000), (1170, 2532),
    (1920, 1080), (800, 600), (480, 640), (4000, 3000), (1440, 1080),
)  # fmt: skip


def immich_preview(width: int, height: int, seed: int = 0, fmt: str = "JPEG") -> bytes:
    """A preview as Immich makes one: the short side shrunk to 1440 px (never enlarged)."""
    scale = min(1.0, IMMICH_PREVIEW_SIDE / min(width, height))
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    buf = io.BytesIO()
    photo(*size, seed=seed).save(buf, fmt, quality=80)
    return buf.getvalue()


def immich_previews(count: int = len(IMMICH_ORIGINALS), webp_every: int = 3) -> list[Sample]:
    """Previews of ``IMMICH_ORIGINALS`` in turn; every ``webp_every``-th one WebP."""
    out = []
    for i in range(count):
        width, height = IMMICH_ORIGINALS[i % len(IMMICH_ORIGINALS)]
        fmt = "WEBP" if webp_every and i % webp_every == webp_every - 1 else "JPEG"
        data = immich_preview(width, height, seed=700 + i, fmt=fmt)
        out.append(Sample(f"{width}x{height}-{fmt.lower()}-{i}", data, width * height / 1e6))
    return out
