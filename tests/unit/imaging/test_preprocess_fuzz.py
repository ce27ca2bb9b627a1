"""Fuzz the decode/preprocess path: damaged files of every accepted format, bounded in time.

Whatever the bytes, ``preprocess`` returns or raises a EmbeddingError (a 4xx): never another
exception type (a 500), never a crash, never a hang (hypothesis' deadline bounds each example).
"""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.harness.photos import jpeg, photo
from clip_gateway.errors import EmbeddingError
from clip_gateway.http.problems import problem_of
from clip_gateway.imaging.preprocess import DecodeOptions, preprocess
from tests import samples

OPTIONS = DecodeOptions(size=224, max_pixels=20_000_000, max_bytes=8 << 20)
SEEDS = {
    "jpeg": samples.compact(3),
    "jpeg-progressive": jpeg(photo(640, 480, seed=4), progressive=True),
    "jpeg-exif": samples.oriented_jpeg(6),
    "png": samples.png(5),
    "webp": samples.webp(6),
    "gif": samples.gif(7),
}


@st.composite
def damaged(draw: st.DrawFn, seed: bytes) -> bytes:
    data = bytearray(seed)
    for _ in range(draw(st.integers(1, 12))):
        action = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if action == "flip":
            data[at] = draw(st.integers(0, 255))
        elif action == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=64))
        elif action == "delete":
            del data[at : at + draw(st.integers(1, 64))]
        else:
            del data[max(at, 2) :]
        if not data:
            break
    return bytes(data)


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(SEEDS))
def test_damaged_images_fail_cleanly(kind: str) -> None:
    out = np.empty((224, 224, 3), np.uint8)

    @settings(
        max_examples=150,
        deadline=timedelta(seconds=5),
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(data=damaged(SEEDS[kind]))
    def check(data: bytes) -> None:
        status = 200
        try:
            preprocess(data, out, OPTIONS)
        except EmbeddingError as exc:
            status = problem_of(exc).status
        assert 200 <= status < 500

    check()
