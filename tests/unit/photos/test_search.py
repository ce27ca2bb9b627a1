"""Ranking by cosine similarity: best first, top K, ties by path."""

from __future__ import annotations

import numpy as np

from clip_gateway.photos.search import Hit, rank


def test_ranks_by_cosine_whatever_the_norms() -> None:
    vectors = np.array([[1, 0], [0, 5], [3, 3], [-1, 0]], dtype=np.float32)
    hits = rank(vectors, ["a", "b", "c", "d"], np.array([0.0, 2.0]), top=3)
    assert [h.path for h in hits] == ["b", "c", "a"]
    assert [h.rank for h in hits] == [1, 2, 3]
    np.testing.assert_allclose([h.score for h in hits], [1.0, np.sqrt(0.5), 0.0], atol=1e-6)


def test_top_beyond_the_library_and_ties() -> None:
    vectors = np.array([[1, 0], [1, 0], [0, 1]], dtype=np.float32)
    hits = rank(vectors, ["z", "y", "x"], np.array([1.0, 0.0]), top=10)
    assert hits == [Hit(1, 1.0, "y"), Hit(2, 1.0, "z"), Hit(3, 0.0, "x")]
    assert rank(np.empty((0, 2), np.float32), [], np.array([1.0, 0.0]), top=5) == []


def test_top_k_agrees_with_a_full_sort() -> None:
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((500, 16)).astype(np.float32)
    paths = [f"{i:03d}" for i in range(500)]
    query = rng.standard_normal(16)
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    expected = np.argsort(-(unit @ (query / np.linalg.norm(query))))[:7]
    assert [h.path for h in rank(vectors, paths, query, 7)] == [paths[i] for i in expected]
