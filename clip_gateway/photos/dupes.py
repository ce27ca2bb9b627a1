"""Near-duplicate groups by cosine similarity: exact, in memory-bounded blocks, union-find."""

from __future__ import annotations

import numpy as np


class UnionFind:
    def __init__(self, size: int) -> None:
        self.parent = list(range(size))

    def find(self, item: int) -> int:
        root = item
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[item] != root:  # path compression
            self.parent[item], item = root, self.parent[item]
        return root

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def normalise(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    result: np.ndarray = (vectors / np.maximum(norms, 1e-12)).astype(np.float32)
    return result


def similar_pairs(
    vectors: np.ndarray, threshold: float, block: int = 4096
) -> list[tuple[int, int, float]]:
    """Every pair (i < j) with cosine >= threshold. Memory: one ``block x block`` tile at a time,
    so a 10^6-photo library needs 64 MB of scratch, not a 4 TB matrix."""
    unit = normalise(vectors)
    pairs: list[tuple[int, int, float]] = []
    for start in range(0, len(unit), block):
        rows = unit[start : start + block]
        for other in range(start, len(unit), block):
            tile = rows @ unit[other : other + block].T
            i, j = np.nonzero(tile >= threshold)
            for a, b in zip(i + start, j + other, strict=True):
                if a < b:
                    pairs.append((int(a), int(b), float(tile[a - start, b - other])))
    return pairs


def groups(vectors: np.ndarray, threshold: float, block: int = 4096) -> list[list[int]]:
    """Connected components of the similarity graph, largest first; singletons left out."""
    finder = UnionFind(len(vectors))
    for a, b, _ in similar_pairs(vectors, threshold, block):
        finder.union(a, b)
    components: dict[int, list[int]] = {}
    for item in range(len(vectors)):
        components.setdefault(finder.find(item), []).append(item)
    found = [members for members in components.values() if len(members) > 1]
    return sorted(found, key=lambda members: (-len(members), members[0]))
