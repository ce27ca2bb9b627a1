"""A thread's CPU time less the garbage collections it ran: what a decode is charged.

Python's cyclic collector runs in whichever thread's allocation crosses its threshold, and a
full collection walks every tracked object of the process (the gateway's imports alone: ~84,000
objects, 0.1-0.4 CPU-s on a loaded 2-core VM). A decode that happens to trigger one would be
charged for the whole heap and refused as overspent (a 20 ms budget, a 40 ms bill), though the
input did nothing. ``gc.callbacks`` tells each collection's start and stop in the thread that
runs it; the time between is kept per thread and subtracted.
"""

from __future__ import annotations

import gc
import threading
import time
from typing import Any

_local = threading.local()


def _on_collection(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _local.started = time.thread_time()
    elif (started := getattr(_local, "started", None)) is not None:
        _local.collected = getattr(_local, "collected", 0.0) + time.thread_time() - started
        _local.started = None


def watch_collections() -> None:
    """Start keeping each thread's collection time (idempotent; cheap: two calls of a few
    hundred nanoseconds per collection)."""
    if _on_collection not in gc.callbacks:
        gc.callbacks.append(_on_collection)


def collected_s() -> float:
    """This thread's CPU seconds spent in garbage collections since ``watch_collections``."""
    return float(getattr(_local, "collected", 0.0))


def own_cpu_s() -> float:
    """This thread's CPU time less its garbage collections: differences of it are what work done
    in this thread cost, whatever the collector did meanwhile."""
    return time.thread_time() - collected_s()
