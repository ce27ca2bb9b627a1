"""Near-duplicate grouping on constructed embeddings with known groups."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pytest

from clip_gateway.photos.dupes import UnionFind, groups, similar_pairs


def library(seed: int = 0) -> tuple[np.ndarray, list[set[int]]]:
    """Groups of 2-5 copies (cosine > 0.99 to their centre) and many unrelated singletons."""
    rng = np.random.default_rng(seed)
    vectors, truth = [], []
    for _ in range(30):
        centre = rng.standard_normal(512)
        members = set()
        for _ in range(int(rng.integers(2, 6))):
            members.add(len(vectors))
            vectors.append(centre + rng.standard_normal(512) * 0.05)
        truth.append(members)
    for _ in range(300):
        vectors.append(rng.standard_normal(512))
    order = rng.permutation(len(vectors))
    where = {old: new for new, old in enumerate(order)}
    shuffled = np.array(vectors, dtype=np.float32)[order]
    return shuffled, [{where[i] for i in group} for group in truth]


def pairs(sets: list[set[int]]) -> set[tuple[int, int]]:
    return {pair for group in sets for pair in combinations(sorted(group), 2)}


@pytest.mark.parametrize("block", [7, 64, 4096])
def test_precision_and_recall_are_one(block: int) -> None:
    vectors, truth = library()
    found = groups(vectors, 0.95, block=block)
    expected, got = pairs(truth), pairs([set(g) for g in found])
    precision = len(expected & got) / len(got)
    recall = len(expected & got) / len(expected)
    assert (precision, recall) == (1.0, 1.0)
    assert sorted(map(sorted, found)) == sorted(map(sorted, truth))


def test_blocked_equals_exact() -> None:
    vectors, _ = library(1)
    exact = {(a, b) for a, b, _ in similar_pairs(vectors, 0.9, block=len(vectors))}
    for block in (1, 5, 33, 100):
        assert {(a, b) for a, b, _ in similar_pairs(vectors, 0.9, block=block)} == exact


def test_groups_are_transitive_closures() -> None:
    a = np.array([1.0, 0.0])
    b = np.array([np.cos(0.3), np.sin(0.3)])  # cos(a,b) = 0.955
    c = np.array([np.cos(0.6), np.sin(0.6)])  # cos(b,c) = 0.955, cos(a,c) = 0.825
    assert groups(np.stack([a, b, c]), 0.95) == [[0, 1, 2]]


def test_union_find() -> None:
    finder = UnionFind(6)
    finder.union(0, 3)
    finder.union(3, 5)
    finder.union(1, 2)
    assert finder.find(5) == finder.find(0) != finder.find(1) == finder.find(2)
    assert finder.find(4) == 4
