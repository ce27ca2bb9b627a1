"""A photo library's embeddings on disk: one ``.npz`` (paths, sha256, vectors), resumable.

Every checkpoint rewrites the file through a temporary name and ``os.replace``, so an
interrupted run leaves the last complete checkpoint, and the next run skips every file whose
content hash is already in it (renamed or copied files too).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".webp"})


def photos(root: Path) -> Iterator[Path]:
    """JPEG/PNG/WebP files under ``root``, in a stable order."""
    for path in sorted(root.rglob("*")):
        if path.suffix.lower() in EXTENSIONS and path.is_file():
            yield path


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass
class Library:
    paths: list[str] = field(default_factory=list)
    hashes: list[str] = field(default_factory=list)
    vectors: list[np.ndarray] = field(default_factory=list)

    @classmethod
    def load(cls, path: Path) -> Library:
        if not path.exists():
            return cls()
        with np.load(path, allow_pickle=False) as data:
            embeddings = data["embeddings"]
            return cls(
                [str(p) for p in data["paths"]],
                [str(h) for h in data["sha256"]],
                list(embeddings) if len(embeddings) else [],
            )

    def known(self) -> dict[str, np.ndarray]:
        return dict(zip(self.hashes, self.vectors, strict=True))

    def add(self, path: str, digest: str, vector: np.ndarray) -> None:
        self.paths.append(path)
        self.hashes.append(digest)
        self.vectors.append(np.asarray(vector, dtype=np.float32))

    def embeddings(self) -> np.ndarray:
        return np.stack(self.vectors) if self.vectors else np.empty((0, 0), np.float32)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = path.with_name(path.name + ".partial.npz")
        np.savez(
            staging,
            paths=np.array(self.paths, dtype=str),
            sha256=np.array(self.hashes, dtype=str),
            embeddings=self.embeddings(),
        )
        os.replace(staging, path)
