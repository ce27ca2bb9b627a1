"""The embedding cache's stores (pipeline/cache.py) and its keys: bounded in bytes, shared
through one SQLite file, and never answering for another preprocessing variant."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import get_args

import numpy as np

from clip_gateway.imaging.preprocess import Variant
from clip_gateway.pipeline.cache import Entry, MemoryCache, SqliteCache, identity, key
from clip_gateway.pipeline.items import ImageItem
from clip_gateway.pipeline.service import EmbeddingService, PipelineOptions
from tests import samples
from tests.fakes import FakeBackend


def rows(count: int, dim: int = 256) -> list[tuple[bytes, Entry]]:
    return [
        (key(b"m", "image", bytes([i])), Entry(np.full(dim, i, np.float32), i, 2 * i, 3 * i))
        for i in range(count)
    ]


def test_memory_keeps_the_most_recently_used_within_its_bytes() -> None:
    cache = MemoryCache(max_bytes=4 * 1024)  # four 1 KiB vectors
    entries = rows(4)
    cache.put(entries)
    assert cache.get(entries[0][0]) is not None  # now the most recently used
    cache.put(rows(5)[4:])
    assert cache.get(entries[1][0]) is None and cache.get(entries[0][0]) is not None
    assert cache.bytes <= 4 * 1024


def test_a_file_written_before_entries_kept_sizes_is_started_afresh(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "cache.sqlite"
    with sqlite3.connect(path) as old:  # the table of the version before: vectors only
        old.execute("CREATE TABLE embeddings (key BLOB PRIMARY KEY, vector BLOB NOT NULL)")
        old.execute("INSERT INTO embeddings VALUES (?, ?)", (b"k", np.ones(4, "<f4").tobytes()))
    old.close()
    cache = SqliteCache(path, 1 << 20)
    assert cache.get(b"k") is None  # its rows cannot answer what a miss answered: gone
    cache.put(rows(1))
    assert cache.get(rows(1)[0][0]) is not None
    cache.close()


def test_sqlite_is_shared_between_connections_and_bounded(tmp_path: Path) -> None:
    path = tmp_path / "cache.sqlite"
    writer, reader = SqliteCache(path, 64 * 1024), SqliteCache(path, 64 * 1024)
    entries = rows(200)  # 200 KiB: over the bound
    writer.put(entries)
    found = reader.get(entries[-1][0])
    assert found is not None and np.array_equal(found.vector, entries[-1][1].vector)
    assert (found.tokens, found.width, found.height) == (199, 398, 597)  # what a miss reported
    assert reader.get(entries[0][0]) is None  # the first written went first
    kept = sum(reader.get(k) is not None for k, _ in entries)
    assert 0 < kept * 1024 <= 64 * 1024
    writer.close()
    reader.close()


def test_the_key_holds_the_model_the_variant_and_the_kind() -> None:
    base = identity("clip_image", 512, "open_clip")
    assert identity("clip_image", 512, "immich") != base
    assert identity("clip_image", 256, "open_clip") != base
    assert key(base, "image", b"x") != key(base, "text", b"x")


def test_immich_preprocessing_never_gets_the_open_clip_vector() -> None:
    fake = FakeBackend()
    options = PipelineOptions(request_timeout_s=10.0, decode_threads=2, horizon_s=5.0)
    image = ImageItem(samples.compact(7))

    async def run(pipeline: EmbeddingService, variant: Variant) -> np.ndarray:
        # the variant is said once, at admission: embed takes it from the reservation
        with pipeline.admit(None, variant=variant) as reservation:
            reservation.add(image)
            reservation.body_read()
            result = await pipeline.embed(reservation, [image], normalize=False)
        return result.vectors[0]

    async def scenario() -> None:
        with ThreadPoolExecutor(2) as pool:
            pipeline = EmbeddingService(fake, pool, options, cache=MemoryCache(1 << 20))
            open_clip = await run(pipeline, "open_clip")
            batches = fake.batches
            assert np.array_equal(await run(pipeline, "open_clip"), open_clip)
            assert fake.batches == batches  # the second open_clip request: a hit
            await run(pipeline, "immich")
            assert fake.batches == batches + 1  # Immich's variant: decoded and run

    asyncio.run(scenario())


def test_images_and_texts_take_one_variant_value() -> None:
    """The pipeline passes one variant to imaging (preprocessing) and text (cleaning), and the
    cache keys embeddings by it: the two layers, which may not import each other, name the same
    values."""
    from clip_gateway import text
    from clip_gateway.imaging import preprocess

    assert get_args(preprocess.Variant) == get_args(text.Variant) == ("open_clip", "immich")
