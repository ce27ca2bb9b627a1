"""A worker's URL fetch slots: how many fetches run at once, all requests together, one request,
one API key. A request takes its slots before any of its fetches starts, in one step on the
event loop (nothing can come between the count and the take), so the worker's cap holds however
many requests arrive together; it holds at most its share, so the slots it does not get stay
free for other clients; a request that finds none free is refused at once (429), as admission
refuses, rather than queued. Each slot taken runs one fetch at a time and is given back when
the request has no URL left for it.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator

from clip_gateway.errors import Overloaded


class FetchSlots:
    """``total`` fetch slots in this worker; one request holds at most ``per_request`` of them,
    one API key at most ``per_key``. ``fetch_timeout_s`` bounds each fetch, so the oldest one
    in flight says when a slot may be free again (Retry-After)."""

    def __init__(self, total: int, per_request: int, per_key: int, fetch_timeout_s: float) -> None:
        self.total = max(1, total)
        self.per_request = max(1, min(per_request, self.total))
        self.per_key = max(1, min(per_key, self.total))
        self.fetch_timeout_s = fetch_timeout_s
        #: Slots held, all requests together, and by API key (only keys holding some).
        self.held = 0
        self.by_key: dict[str, int] = {}
        self._fetches: dict[object, float] = {}

    def lease(self, key: str | None) -> Lease:
        """A request's slots (none yet), charged to its API key (None: no share to keep)."""
        return Lease(self, key)

    @contextlib.contextmanager
    def fetching(self) -> Iterator[None]:
        """One fetch in flight (its start is what Retry-After is told from)."""
        token = object()
        self._fetches[token] = time.monotonic()
        try:
            yield
        finally:
            del self._fetches[token]

    def retry_after(self) -> float:
        """Seconds until the oldest fetch in flight is over, done or timed out (at least 1)."""
        if not self._fetches:
            return 1.0
        oldest = min(self._fetches.values())
        return max(1.0, math.ceil(oldest + self.fetch_timeout_s - time.monotonic()))


class Lease:
    """The slots one request holds: taken with ``take`` (at once, or not at all), given back
    one by one with ``give``."""

    def __init__(self, slots: FetchSlots, key: str | None) -> None:
        self.slots = slots
        self.key = key
        self.held = 0

    def room(self) -> int:
        """Slots this request may take now: within its share, its key's and the worker's."""
        slots = self.slots
        room = min(slots.per_request - self.held, slots.total - slots.held)
        if self.key is not None:
            room = min(room, slots.per_key - slots.by_key.get(self.key, 0))
        return max(0, room)

    def take(self, wanted: int) -> int:
        """Up to ``wanted`` more slots, as many as there is room for now (maybe none)."""
        count = min(self.room(), max(0, wanted))
        slots = self.slots
        self.held += count
        slots.held += count
        if self.key is not None and count:
            slots.by_key[self.key] = slots.by_key.get(self.key, 0) + count
        return count

    def give(self) -> None:
        """One slot back."""
        slots = self.slots
        self.held -= 1
        slots.held -= 1
        if self.key is not None:
            left = slots.by_key.get(self.key, 1) - 1
            if left > 0:
                slots.by_key[self.key] = left
            else:
                slots.by_key.pop(self.key, None)

    def refusal(self) -> Overloaded:
        """Why this request got no slot at all (its key's share is full, or the worker's)."""
        slots = self.slots
        if self.key is not None and slots.by_key.get(self.key, 0) >= slots.per_key:
            reason = (
                f"this API key has {slots.by_key[self.key]} URL fetches in flight, its share of "
                f"the {slots.total} this worker runs at once"
            )
        else:
            reason = f"{slots.held} URL fetches in flight, the most this worker runs at once"
        return Overloaded(reason, retry_after=slots.retry_after())
