"""Which libraries decode and resize here: the fast path (pillow-simd) or stock Pillow.

pillow-simd and Pillow are two distributions of the same ``PIL`` package, so ``import PIL``
cannot tell them apart; the distribution whose files hold the imported ``PIL`` can. Reported in
the ready line and ``/v1/models``, and checked by ``make install`` (``clip-gateway imaging
--require-simd``): on the same compact JPEGs stock Pillow preprocesses at under half of
pillow-simd's images/s per core (docs/PERFORMANCE.md).
"""

from __future__ import annotations

import functools
import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

import PIL


@dataclass(frozen=True)
class ImagingPath:
    #: The distribution that owns the imported ``PIL`` and its version, e.g.
    #: ``pillow-simd 12.1.1.post0``: every resize, and PNG/WebP/GIF decoding.
    resize: str
    #: JPEG: libjpeg-turbo inside simplejpeg's wheel, DCT-scaled (imaging/jpeg.py).
    decode: str
    #: Whether the resize runs pillow-simd's SIMD resampler.
    simd: bool


def _pil_distribution() -> tuple[str, str]:
    """(name, version) of the installed distribution whose files are the imported ``PIL``."""
    imported = Path(PIL.__file__).resolve()
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name in ("pillow", "pillow-simd"):
            located = Path(str(dist.locate_file("PIL/__init__.py"))).resolve()
            if located == imported:
                return name, dist.version
    return "unknown PIL", PIL.__version__


def pillow_reads(kind: str) -> bool:
    """Whether the imported PIL decodes ``kind`` (``png``, ``webp``, ``gif``): pillow-simd built
    without libwebp has no WebP plugin. A PIL without ``Image`` (a stand-in) is not judged."""
    try:
        from PIL import Image
    except ImportError:
        return True
    Image.init()  # once: the plugins this Pillow was built with
    return kind.upper() in Image.OPEN


# Once per process: the imported PIL's distribution cannot change, and finding it reads every
# installed distribution's metadata (each app start and decode-speed record asked again).
@functools.cache
def current() -> ImagingPath:
    name, version = _pil_distribution()
    jpeg = f"libjpeg-turbo (simplejpeg {importlib.metadata.version('simplejpeg')}), DCT-scaled"
    others = "PNG/WebP/GIF" if pillow_reads("webp") else "PNG/GIF (no WebP: built without it)"
    return ImagingPath(
        resize=f"{name} {version}",
        decode=f"JPEG: {jpeg}; {others}: {name} {version}",
        simd=name == "pillow-simd",
    )
