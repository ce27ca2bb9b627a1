"""The embeddings file: round trip, atomic checkpoints, content-hash lookup."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gateway.client.library import Library, photos, sha256


def test_round_trip_and_known_hashes(tmp_path: Path) -> None:
    library = Library()
    library.add("a.jpg", "h1", np.ones(4))
    library.add("b.jpg", "h2", np.zeros(4))
    out = tmp_path / "lib.npz"
    library.save(out)
    loaded = Library.load(out)
    assert loaded.paths == ["a.jpg", "b.jpg"]
    assert loaded.embeddings().shape == (2, 4)
    assert set(loaded.known()) == {"h1", "h2"}
    assert not list(tmp_path.glob("*.partial*"))  # written through a temporary name


def test_missing_file_is_an_empty_library(tmp_path: Path) -> None:
    assert Library.load(tmp_path / "none.npz").paths == []


def test_walks_only_images_in_stable_order(tmp_path: Path) -> None:
    for name in ("b.JPG", "a.png", "c.webp", "notes.txt", "sub/d.jpeg"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(name.encode())
    assert [p.name for p in photos(tmp_path)] == ["a.png", "b.JPG", "c.webp", "d.jpeg"]
    assert sha256(tmp_path / "a.png") != sha256(tmp_path / "b.JPG")
