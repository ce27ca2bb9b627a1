"""The allocator trimmer: heavy or failed work asks for a trim; one asked for too soon after the
last is deferred to the end of the interval, never dropped (the last burst's memory is handed
back even when no request follows it)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from clip_gateway.config import memory

pytestmark = pytest.mark.skipif(memory._libc() is None, reason="glibc only")


class Runs:
    def __init__(self) -> None:
        self.count = 0
        self.second = threading.Event()

    def __call__(self, trim: Callable[[], None]) -> None:
        trim()  # a real malloc_trim: harmless
        self.count += 1
        if self.count == 2:
            self.second.set()


def test_a_failed_decode_trims_at_once_and_a_second_one_at_the_end_of_the_interval() -> None:
    runs = Runs()
    trimmer = memory.Trimmer(runs, every_bytes=1 << 40, interval_s=0.2)
    trimmer.worked(0, failed=True)
    assert runs.count == 1  # at once
    trimmer.worked(0, failed=True)  # too soon: deferred...
    trimmer.worked(0, failed=True)  # ...once, however many ask meanwhile
    assert runs.count == 1
    assert runs.second.wait(10)  # ...then run, with no further work to trigger it
    assert runs.count == 2


def test_light_work_does_not_trim() -> None:
    runs = Runs()
    trimmer = memory.Trimmer(runs, every_bytes=1000, interval_s=0.0)
    trimmer.worked(999)
    assert runs.count == 0
    trimmer.worked(1)  # the churn reaches the threshold
    assert runs.count == 1
