"""Admission control counted in images: a bounded in-flight budget that fails fast, never queues."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from gateway.errors import LimitExceeded, Overloaded
from gateway.observability.metrics import Metrics


class ImageBudget:
    """At most ``capacity`` images between admission and response, per process.

    ``try_acquire`` never waits: a request that does not fit is refused with 429 at once, so a
    traffic spike costs the rejected clients a round trip instead of costing everyone queueing
    delay (the decode pool and Triton's queue stay short). All access is from the event loop
    thread, so plain integers suffice.
    """

    def __init__(self, capacity: int, metrics: Metrics) -> None:
        self.capacity = capacity
        self.in_flight = 0
        self._gauge = metrics.inflight

    def try_acquire(self, images: int) -> bool:
        if self.in_flight + images > self.capacity:
            return False
        self.in_flight += images
        self._gauge.inc(images)
        return True

    def release(self, images: int) -> None:
        self.in_flight -= images
        self._gauge.dec(images)

    @contextmanager
    def admit(self, images: int) -> Iterator[None]:
        if images > self.capacity:
            raise LimitExceeded(
                f"{images} images can never fit the in-flight budget of {self.capacity}; "
                "split the request"
            )
        if not self.try_acquire(images):
            raise Overloaded(
                f"{self.in_flight} of {self.capacity} images in flight; {images} more do not fit",
                retry_after=1.0,
                in_flight=self.in_flight,
                capacity=self.capacity,
            )
        try:
            yield
        finally:
            self.release(images)
