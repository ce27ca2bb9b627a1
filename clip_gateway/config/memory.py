"""Give memory back after bursts: glibc's allocator, told to, and asked to.

By default glibc raises its mmap threshold after every large free (up to 32 MB), so after a burst
of big decodes later buffers come from arenas that are never returned, one arena per decode
thread. ``tune`` fixes the threshold (big buffers are mmapped and unmapped when freed) and caps
the arenas; ``Trimmer`` hands the rest back with ``malloc_trim`` after heavy work, at most once
per ``interval_s``. Measured on bursts of large and hostile inputs:
bench/results/hostile/hostile.md. Elsewhere than glibc these are no-ops.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from collections.abc import Callable

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
#: Buffers from this size up are mmapped: every decoded image, resize buffer and batch.
MMAP_THRESHOLD = 256 << 10
ARENAS = 2


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.mallopt  # noqa: B018 (glibc only)
        libc.malloc_trim  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def tune() -> bool:
    """Call before the threads that allocate start; True when glibc took the settings."""
    libc = _libc()
    if libc is None:
        return False
    return all(
        libc.mallopt(option, value) == 1
        for option, value in (
            (_M_MMAP_THRESHOLD, MMAP_THRESHOLD),
            (_M_ARENA_MAX, ARENAS),
            (_M_TRIM_THRESHOLD, 4 << 20),
        )
    )


class Trimmer:
    """Count heavy work; once it passes ``every_bytes``, trim (in ``run``, e.g. a pool thread)."""

    def __init__(
        self,
        run: Callable[[Callable[[], None]], object],
        every_bytes: int = 64 << 20,
        interval_s: float = 1.0,
    ) -> None:
        self._run = run
        self._every = every_bytes
        self._interval = interval_s
        self._pending = 0
        self._last = 0.0
        self._libc = _libc()
        self._lock = threading.Lock()
        self._deferred: threading.Timer | None = None

    def worked(self, bytes_touched: int, *, failed: bool = False) -> None:
        """``bytes_touched`` more churned; ``failed``: work whose churn is unknown (a failed
        decode) — trim as soon as the interval allows. A trim due within the interval of the
        last one is deferred to its end, not dropped: the last burst's memory is handed back
        even when nothing follows it."""
        if self._libc is None:
            return
        with self._lock:
            self._pending += bytes_touched
            if not (failed or self._pending >= self._every) or self._deferred is not None:
                return
            wait = self._last + self._interval - time.monotonic()
            if wait > 0:
                self._deferred = threading.Timer(wait, self._trim_later)
                self._deferred.daemon = True
                self._deferred.start()
                return
            self._pending, self._last = 0, time.monotonic()
        self._submit()

    def _trim_later(self) -> None:
        with self._lock:
            self._deferred = None
            self._pending, self._last = 0, time.monotonic()
        self._submit()

    def _submit(self) -> None:
        with contextlib.suppress(RuntimeError):  # the pool is shutting down
            self._run(self._trim)

    def _trim(self) -> None:
        assert self._libc is not None
        self._libc.malloc_trim(0)
