"""Ranking a library against a query embedding (a text's or a photo's) by cosine similarity."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from clip_gateway.photos.dupes import normalise


@dataclass(frozen=True)
class Hit:
    rank: int  # 1 = the best
    score: float  # cosine similarity to the query
    path: str


def rank(vectors: np.ndarray, paths: list[str], query: np.ndarray, top: int) -> list[Hit]:
    """The ``top`` rows of ``vectors`` most similar to ``query``, best first (ties by path)."""
    if not len(vectors) or top < 1:
        return []
    scores = normalise(vectors) @ normalise(query.reshape(1, -1))[0]
    top = min(top, len(scores))
    # argpartition finds the top K in O(n); only those K are sorted
    best = np.argpartition(-scores, top - 1)[:top]
    order = sorted(best, key=lambda i: (-scores[i], paths[i]))
    return [Hit(n, float(scores[i]), paths[i]) for n, i in enumerate(order, 1)]
