"""``clip-gateway embed``: a folder into a library, never stopping for one bad file.

Walk (walk.py), then for each photo: unchanged since the last run → nothing to do; content
already embedded (a copy, a rename) → its embedding is reused; otherwise it is read, shrunk
and sent with ``skip_invalid`` (``Client.embed_valid``), and each file that cannot be embedded
is recorded with its reason, so an unchanged bad file is not tried again (``retry_failed``).
The library is saved every ``checkpoint_every`` files.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from clip_gateway.client.core import Embedded
from clip_gateway.client.sync import Client
from clip_gateway.photos.library import Failure, Library, Stamp, sha256
from clip_gateway.photos.walk import Counts, Photo, walk


class ModelMismatch(Exception):
    """The library holds another model's embeddings than the gateway serves."""


@dataclass
class Report:
    embedded: int = 0
    reused: int = 0  # same content as a file already embedded
    unchanged: int = 0  # embedded before, same size and time
    failed: list[tuple[str, str]] = field(default_factory=list)  # this run: (path, reason)
    failed_before: list[tuple[str, str]] = field(default_factory=list)  # not retried
    noted: list[tuple[str, str]] = field(default_factory=list)  # symlink loops, broken links
    removed: int = 0  # rows of files that are gone
    counts: Counts = field(default_factory=Counts)
    seconds: float = 0.0

    @property
    def complete(self) -> bool:
        """Every photo in the folder is embedded."""
        return not self.failed and not self.failed_before


@dataclass(frozen=True)
class Options:
    checkpoint_every: int = 512
    retry_failed: bool = False
    hidden: bool = False


def embed_folder(
    root: Path,
    out: Path,
    client: Client,
    options: Options,
    progress: Callable[[int, int], None] = lambda done, total: None,
) -> tuple[Library, Report]:
    """Bring the library at ``out`` up to date with ``root``; ``progress(done, total)``."""
    started = time.monotonic()
    library, report = Library.load(out), Report()
    root = root.absolute()
    todo = _triage(root, library, report, options)
    _prune(root, library, report)
    if todo:  # one quick request first: unreachable or refused says so before any work
        served = str(client.model_info().get("id", ""))
        if library.model and served and library.model != served:
            raise ModelMismatch(
                f"{out} holds {library.model} embeddings; the gateway serves {served}"
            )
        library.model = library.model or served
        progress(0, len(todo))
    with ThreadPoolExecutor(4, thread_name_prefix="clip-hash") as hashing:
        for start in range(0, len(todo), options.checkpoint_every):
            chunk = todo[start : start + options.checkpoint_every]
            _embed_chunk(chunk, library, report, client, hashing)
            library.save(out)  # checkpoint: an interrupted run keeps all of this
            progress(start + len(chunk), len(todo))
    if not todo:
        library.save(out)
    report.seconds = time.monotonic() - started
    return library, report


def _triage(root: Path, library: Library, report: Report, options: Options) -> list[Photo]:
    """The photos to look at; the rest counted or recorded in ``report`` and ``library``."""
    todo: list[Photo] = []
    for found in walk(root, report.counts, hidden=options.hidden):
        path = str(found.path)
        if isinstance(found, Photo):
            stamp = Stamp.of(found.stat)
            before = library.failures.get(path)
            if library.unchanged(path, stamp):
                report.unchanged += 1
            elif before and before.stamp == stamp and not options.retry_failed:
                report.failed_before.append((path, before.reason))
            else:
                todo.append(found)
        elif not found.failed:
            report.noted.append((path, found.reason))
        elif found.stat is None:  # a folder: looked at again on every run
            report.failed.append((path, found.reason))
        else:
            before = library.failures.get(path)
            stamp = Stamp.of(found.stat)
            if before and before.stamp == stamp and not options.retry_failed:
                report.failed_before.append((path, before.reason))
            else:
                library.fail(path, Failure("", stamp, found.reason))
                report.failed.append((path, found.reason))
    return todo


def _prune(root: Path, library: Library, report: Report) -> None:
    """Forget files under ``root`` that no longer exist."""
    inside = str(root) + os.sep
    gone = {p for p in library.paths if p.startswith(inside) and not os.path.lexists(p)}
    library.remove(gone)
    for path in [p for p in library.failures if p.startswith(inside) and not os.path.lexists(p)]:
        del library.failures[path]
    report.removed = len(gone)


def _embed_chunk(
    chunk: list[Photo],
    library: Library,
    report: Report,
    client: Client,
    hashing: ThreadPoolExecutor,
) -> None:
    known = library.known()
    digests = list(hashing.map(_digest, chunk))
    send: dict[str, Photo] = {}  # one file per new content
    for photo, digest in zip(chunk, digests, strict=True):
        if isinstance(digest, OSError):
            reason = f"cannot read: {digest.strerror or digest}"
            library.fail(str(photo.path), Failure("", Stamp.of(photo.stat), reason))
            report.failed.append((str(photo.path), reason))
        elif digest not in known:
            send.setdefault(digest, photo)
    if not send:
        answer = Embedded(np.empty((0, 0), np.float32), [], [])
    else:
        answer = client.embed_valid([photo.path for photo in send.values()])
    new = list(send)
    known.update((new[i], vector) for i, vector in zip(answer.indices, answer.vectors, strict=True))
    refused = {new[error.index]: str(error) for error in answer.errors}
    for photo, digest in zip(chunk, digests, strict=True):
        if isinstance(digest, OSError):
            continue
        path, stamp = str(photo.path), Stamp.of(photo.stat)
        if digest in known:
            library.add(path, digest, known[digest], stamp)
            fresh = send.get(digest) is photo
            report.embedded += fresh
            report.reused += not fresh
        else:
            library.fail(path, Failure(digest, stamp, refused[digest]))
            report.failed.append((path, refused[digest]))


def _digest(photo: Photo) -> str | OSError:
    try:
        return sha256(photo.path)
    except OSError as exc:
        return exc


def summary(report: Report, library: Library, out: Path) -> list[str]:
    """What a run did, for a person: the files not embedded, then one summary line."""
    lines = []
    for heading, listed in (
        ("could not embed", report.failed),
        (
            "failed before, unchanged, not retried (--retry-failed tries again)",
            report.failed_before,
        ),
        ("not followed", report.noted),
    ):
        if listed:
            lines.append(f"{heading}: {len(listed)}")
            lines += [f"  {path}: {reason}" for path, reason in sorted(listed)]
    reasons = Counter(reason.split(":")[0] for _, reason in report.failed + report.failed_before)
    failed = ", ".join(f"{kind}: {n}" for kind, n in sorted(reasons.items()))
    rate = report.embedded / report.seconds if report.seconds else 0.0
    lines.append(
        f"embedded {report.embedded}, reused {report.reused} (same content), unchanged "
        f"{report.unchanged}, failed {len(report.failed) + len(report.failed_before)}"
        + (f" ({failed})" if failed else "")
        + f", skipped {report.counts.hidden} hidden and {report.counts.other} other files"
        + (f", forgot {report.removed} deleted" if report.removed else "")
        + f"; {report.seconds:.1f} s, {rate:.1f} images/s; {len(library.paths)} photos in {out}"
    )
    return lines
