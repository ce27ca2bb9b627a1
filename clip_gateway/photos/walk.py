"""Finding the photos under a folder as a real photo folder is: nested, with hidden files,
symlinks (loops too), files that are images under any name and names that are not images.

Photos are told by their first bytes (formats.py), so a JPEG without an extension is found
and a text file named ``.jpg`` is reported as not an image rather than sent. Symlinked folders
are followed once: a link back to a folder already on the way down is a loop, reported and
not followed. Hidden files and folders (a leading dot: ``.thumbnails``, ``._IMG_0001.JPG``
from macOS) are left out unless asked for.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from clip_gateway.client import formats


@dataclass(frozen=True)
class Photo:
    path: Path
    stat: os.stat_result


@dataclass(frozen=True)
class Unreadable:
    """A path that could not be looked at, or is not an image though named like one."""

    path: Path
    reason: str
    #: A file or folder the user would expect to be embedded (counts as a failure); a symlink
    #: loop or a broken link is only noted.
    failed: bool = True
    #: For a file: its size and time, so that an unchanged one is known as failed before.
    stat: os.stat_result | None = None


@dataclass
class Counts:
    """What the walk passed over without a word per file."""

    hidden: int = 0
    other: int = 0  # files that are no image by content or name (sidecars, videos, RAW)


def walk(root: Path, counts: Counts, *, hidden: bool = False) -> Iterator[Photo | Unreadable]:
    """Photos and problems under ``root``, depth first, in name order."""
    start = os.stat(root)
    yield from _walk(root, (start.st_dev, start.st_ino), [], counts, hidden)


def _walk(
    folder: Path,
    key: tuple[int, int],
    ancestors: list[tuple[int, int]],
    counts: Counts,
    hidden: bool,
) -> Iterator[Photo | Unreadable]:
    try:
        with os.scandir(folder) as listing:
            entries = sorted(listing, key=lambda entry: entry.name)
    except OSError as exc:
        yield Unreadable(folder, f"cannot list folder: {exc.strerror or exc}")
        return
    chain = [*ancestors, key]
    for entry in entries:
        if entry.name.startswith(".") and not hidden:
            counts.hidden += 1
            continue
        path = Path(entry.path)
        try:
            stat = entry.stat()  # follows symlinks
        except OSError as exc:
            yield _broken(path, exc)
            continue
        if entry.is_dir():
            inode = (stat.st_dev, stat.st_ino)
            if inode in chain:
                yield Unreadable(
                    path, f"symlink loop: leads back to {os.path.realpath(path)}", False
                )
            else:
                yield from _walk(path, inode, chain, counts, hidden)
        elif entry.is_file():
            yield from _photo(path, stat, counts)


def _broken(path: Path, exc: OSError) -> Unreadable:
    if path.is_symlink():
        reason = "symlink loop" if exc.errno == 40 else "broken symlink"  # 40: ELOOP
        return Unreadable(path, f"{reason}: {os.readlink(path)}", False)
    return Unreadable(path, f"cannot read: {exc.strerror or exc}")


def _photo(path: Path, stat: os.stat_result, counts: Counts) -> Iterator[Photo | Unreadable]:
    named = path.suffix.lower() in formats.EXTENSIONS
    try:
        with open(path, "rb") as fh:
            head = fh.read(formats.HEAD_BYTES)
    except OSError as exc:
        if named:
            yield Unreadable(path, f"cannot read: {exc.strerror or exc}", stat=stat)
        else:
            counts.other += 1
        return
    if formats.identify(head) is not None:
        yield Photo(path, stat)
    elif not named:
        counts.other += 1
    elif not head:
        yield Unreadable(path, "empty file: 0 bytes", stat=stat)
    else:
        reason = "not an image: no JPEG, PNG, WebP, GIF, HEIF or AVIF signature"
        yield Unreadable(path, reason, stat=stat)
