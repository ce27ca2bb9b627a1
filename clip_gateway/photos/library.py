"""A photo library's embeddings on disk: one ``.npz`` that numpy reads, resumable.

Arrays: ``paths``, ``sha256``, ``embeddings`` (float32 ``[n, D]``, unit length), ``sizes`` and
``mtimes`` (bytes and modification time in ns: a file whose path, size and time are unchanged
is not read again), ``model`` (the served model's id), and the files that could not be
embedded: ``failed_paths``, ``failed_sha256``, ``failed_sizes``, ``failed_mtimes``,
``failed_reasons`` (an unchanged failed file is not retried unless asked).

Every checkpoint rewrites the file through a temporary name and ``os.replace``, so an
interrupted run leaves the last complete checkpoint, and the next run skips every file whose
content hash is already in it (renamed or copied files too).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class Stamp:
    """What says a file is unchanged since it was last looked at."""

    size: int
    mtime_ns: int

    @classmethod
    def of(cls, stat: os.stat_result) -> Stamp:
        return cls(stat.st_size, stat.st_mtime_ns)


@dataclass(frozen=True)
class Failure:
    digest: str  # "" when the file could not even be read
    stamp: Stamp
    reason: str


@dataclass
class Library:
    paths: list[str] = field(default_factory=list)
    hashes: list[str] = field(default_factory=list)
    vectors: list[np.ndarray] = field(default_factory=list)
    stamps: list[Stamp] = field(default_factory=list)
    failures: dict[str, Failure] = field(default_factory=dict)
    model: str = ""
    _rows: dict[str, int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._rows = {path: row for row, path in enumerate(self.paths)}

    @classmethod
    def load(cls, path: Path) -> Library:
        """The library at ``path`` (empty when there is none); files written before sizes,
        times and failures were kept load too (their files are hashed once more)."""
        if not path.exists():
            return cls()
        with np.load(path, allow_pickle=False) as data:
            paths = [str(p) for p in data["paths"]]
            embeddings = data["embeddings"]
            unknown = np.full(len(paths), -1)
            stamps = [
                Stamp(int(s), int(t))
                for s, t in zip(
                    data.get("sizes", unknown), data.get("mtimes", unknown), strict=True
                )
            ]
            failures = {
                str(p): Failure(str(h), Stamp(int(s), int(t)), str(r))
                for p, h, s, t, r in zip(
                    *(data.get(f"failed_{k}", np.empty(0)) for k in _FAILURE_KEYS), strict=True
                )
            }
            return cls(
                paths,
                [str(h) for h in data["sha256"]],
                list(embeddings) if len(embeddings) else [],
                stamps,
                failures,
                str(data["model"]) if "model" in data else "",
            )

    def known(self) -> dict[str, np.ndarray]:
        """Content hash → embedding."""
        return dict(zip(self.hashes, self.vectors, strict=True))

    def unchanged(self, path: str, stamp: Stamp) -> bool:
        """``path`` is embedded and its size and time are what they were then."""
        row = self._rows.get(path)
        return row is not None and self.stamps[row] == stamp

    def add(self, path: str, digest: str, vector: np.ndarray, stamp: Stamp) -> None:
        """Record ``path``'s embedding (replacing what was known of the path)."""
        self.failures.pop(path, None)
        entry = (digest, np.asarray(vector, dtype=np.float32), stamp)
        row = self._rows.get(path)
        if row is None:
            self._rows[path] = len(self.paths)
            self.paths.append(path)
            self.hashes.append(entry[0])
            self.vectors.append(entry[1])
            self.stamps.append(entry[2])
        else:
            self.hashes[row], self.vectors[row], self.stamps[row] = entry

    def fail(self, path: str, failure: Failure) -> None:
        """Record that ``path`` could not be embedded (a changed file loses its old row)."""
        self.remove({path})
        self.failures[path] = failure

    def remove(self, paths: set[str]) -> None:
        keep = [row for row, path in enumerate(self.paths) if path not in paths]
        if len(keep) == len(self.paths):
            return
        self.paths = [self.paths[row] for row in keep]
        self.hashes = [self.hashes[row] for row in keep]
        self.vectors = [self.vectors[row] for row in keep]
        self.stamps = [self.stamps[row] for row in keep]
        self._rows = {path: row for row, path in enumerate(self.paths)}

    def embeddings(self) -> np.ndarray:
        return np.stack(self.vectors) if self.vectors else np.empty((0, 0), np.float32)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_name(path.name + ".partial.npz")
        failed = list(self.failures.items())
        np.savez(
            staging,
            paths=np.array(self.paths, dtype=str),
            sha256=np.array(self.hashes, dtype=str),
            embeddings=self.embeddings(),
            sizes=np.array([s.size for s in self.stamps], dtype=np.int64),
            mtimes=np.array([s.mtime_ns for s in self.stamps], dtype=np.int64),
            model=np.array(self.model),
            failed_paths=np.array([p for p, _ in failed], dtype=str),
            failed_sha256=np.array([f.digest for _, f in failed], dtype=str),
            failed_sizes=np.array([f.stamp.size for _, f in failed], dtype=np.int64),
            failed_mtimes=np.array([f.stamp.mtime_ns for _, f in failed], dtype=np.int64),
            failed_reasons=np.array([f.reason for _, f in failed], dtype=str),
        )
        os.replace(staging, path)


_FAILURE_KEYS = ("paths", "sha256", "sizes", "mtimes", "reasons")
