"""A thread's CPU time less its garbage collections (pipeline/cputime.py)."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from clip_gateway.pipeline import cputime
from clip_gateway.pipeline.cputime import collected_s, own_cpu_s, watch_collections


@pytest.fixture
def heap() -> Iterator[list[list[object]]]:
    """50,000 more tracked objects in cycles: a full collection walks them all (ms at least)."""
    watch_collections()
    objects: list[list[object]] = []
    for _ in range(50_000):
        cell: list[object] = []
        cell.append(cell)
        objects.append(cell)
    yield objects
    objects.clear()


def test_a_full_collection_is_kept_out_of_the_threads_own_cpu_time(
    heap: list[list[object]],
) -> None:
    cpu, own, collected = time.thread_time(), own_cpu_s(), collected_s()
    gc.collect()
    spent = time.thread_time() - cpu
    assert collected_s() - collected == pytest.approx(spent, abs=2e-3)
    assert spent > 1e-3  # the collection really walked the heap
    assert own_cpu_s() - own < spent / 5


def test_each_thread_keeps_its_own_collections(heap: list[list[object]]) -> None:
    """A collection run in one thread is charged to none of the others."""

    def collect_there() -> float:
        before = collected_s()
        gc.collect()
        return collected_s() - before

    # no automatic collection in this thread meanwhile (starting the pool allocates: after
    # some test orders its threshold is crossed here, and that one is this thread's own)
    gc.disable()
    try:
        here = collected_s()
        with ThreadPoolExecutor(1) as pool:
            there = pool.submit(collect_there).result()
        assert collected_s() == here
    finally:
        gc.enable()
    assert there > 1e-3
    assert threading.current_thread() is threading.main_thread()


def test_watching_twice_registers_one_callback() -> None:
    watch_collections()
    watch_collections()
    ours = [callback for callback in gc.callbacks if callback.__module__ == cputime.__name__]
    assert len(ours) == 1
