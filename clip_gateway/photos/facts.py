"""What a person weighs when choosing among near-duplicates: pixels, bytes, date; and the rule
that picks the one to keep."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from PIL import Image

from clip_gateway.client import formats

#: How ``best`` chooses, in words (the review page and ``dupes`` print it).
BEST_RULE = "the largest: most pixels, then the largest file, then the earliest date"

_EXIF_IFD = 0x8769
_DATE_TIME_ORIGINAL = 0x9003
_DATE_TIME = 0x0132
_ORIENTATION = 0x0112


@dataclass(frozen=True)
class Facts:
    width: int = 0  # as the photo is seen (EXIF orientation applied); 0 when unreadable
    height: int = 0
    size: int = 0  # bytes on disk
    date: datetime | None = None
    date_source: str = ""  # "taken" (EXIF) or "modified" (file time)

    @property
    def pixels(self) -> int:
        return self.width * self.height


def facts(path: str | Path) -> Facts:
    """Facts of the photo at ``path``, from its header and EXIF block (no full decode)."""
    try:
        stat = os.stat(path)
        with open(path, "rb") as fh:
            kind = formats.identify(fh.read(formats.HEAD_BYTES))
            fh.seek(0)
            formats.plugins_for(kind)
            with Image.open(fh) as image:
                width, height = image.size
                exif = image.getexif()
    except (OSError, ValueError, SyntaxError):  # Pillow's kinds for an unreadable header
        return Facts()
    if exif.get(_ORIENTATION) in (5, 6, 7, 8):
        width, height = height, width
    taken = _exif_date(exif)
    if taken is not None:
        return Facts(width, height, stat.st_size, taken, "taken")
    return Facts(width, height, stat.st_size, datetime.fromtimestamp(stat.st_mtime), "modified")


def _exif_date(exif: Image.Exif) -> datetime | None:
    text = exif.get_ifd(_EXIF_IFD).get(_DATE_TIME_ORIGINAL) or exif.get(_DATE_TIME)
    try:
        return datetime.strptime(str(text).strip("\x00 "), "%Y:%m:%d %H:%M:%S")
    except ValueError:
        return None


def best(members: list[Facts]) -> int:
    """The position in ``members`` of the photo to keep, by ``BEST_RULE``."""

    def key(position: int) -> tuple[int, int, float]:
        fact = members[position]
        when = fact.date.timestamp() if fact.date else float("inf")
        return (-fact.pixels, -fact.size, when)

    return min(range(len(members)), key=key)


def human_size(size: int) -> str:
    """``532 B``, ``48.2 KB``, ``3.1 MB`` (powers of 1000, as file managers show)."""
    if size < 1000:
        return f"{size} B"
    scaled = float(size)
    for unit in ("KB", "MB", "GB"):
        scaled /= 1000
        if scaled < 1000 or unit == "GB":
            break
    return f"{scaled:.1f} {unit}"
