"""The library file: round trip, atomic checkpoints, unchanged files, recorded failures."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from clip_gateway.photos.library import Failure, Library, Stamp, sha256

A, B = Stamp(10, 1_000), Stamp(20, 2_000)


def test_round_trip_with_failures_and_model(tmp_path: Path) -> None:
    library = Library(model="ViT-B-32")
    library.add("a.jpg", "h1", np.ones(4), A)
    library.add("b.jpg", "h2", np.zeros(4), B)
    library.fail("bad.jpg", Failure("h3", A, "invalid image: truncated"))
    out = tmp_path / "lib.npz"
    library.save(out)
    loaded = Library.load(out)
    assert loaded.paths == ["a.jpg", "b.jpg"]
    assert loaded.embeddings().shape == (2, 4) and loaded.embeddings().dtype == np.float32
    assert set(loaded.known()) == {"h1", "h2"}
    assert loaded.failures == {"bad.jpg": Failure("h3", A, "invalid image: truncated")}
    assert loaded.model == "ViT-B-32"
    assert loaded.unchanged("a.jpg", A) and not loaded.unchanged("a.jpg", B)
    assert not list(tmp_path.glob("*.partial*"))  # written through a temporary name
    with np.load(out) as raw:  # plain numpy reads it
        assert list(raw["paths"]) == ["a.jpg", "b.jpg"]
        assert list(raw["failed_reasons"]) == ["invalid image: truncated"]


def test_a_changed_file_replaces_its_row_and_a_fixed_one_leaves_the_failures() -> None:
    library = Library()
    library.add("a.jpg", "h1", np.ones(4), A)
    library.add("a.jpg", "h2", np.zeros(4), B)
    assert library.paths == ["a.jpg"] and library.hashes == ["h2"]
    library.fail("a.jpg", Failure("h3", A, "empty file"))
    assert library.paths == [] and "a.jpg" in library.failures  # its old embedding is gone
    library.add("a.jpg", "h4", np.ones(4), B)
    assert library.paths == ["a.jpg"] and library.failures == {}


def test_remove_keeps_rows_aligned() -> None:
    library = Library()
    for i, name in enumerate("abcd"):
        library.add(name, f"h{i}", np.full(2, i), Stamp(i, i))
    library.remove({"b", "d"})
    assert library.paths == ["a", "c"] and library.hashes == ["h0", "h2"]
    assert library.embeddings()[:, 0].tolist() == [0, 2]
    assert library.unchanged("c", Stamp(2, 2))


def test_a_file_from_before_sizes_and_failures_loads(tmp_path: Path) -> None:
    old = tmp_path / "old.npz"
    np.savez(old, paths=np.array(["a.jpg"]), sha256=np.array(["h1"]), embeddings=np.ones((1, 4)))
    library = Library.load(old)
    assert library.paths == ["a.jpg"] and library.failures == {} and library.model == ""
    assert not library.unchanged("a.jpg", A)  # unknown stamps: hashed again, then reused


def test_missing_file_is_an_empty_library(tmp_path: Path) -> None:
    assert Library.load(tmp_path / "none.npz").paths == []


def test_sha256(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"abc")
    expected = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert sha256(tmp_path / "a") == expected
