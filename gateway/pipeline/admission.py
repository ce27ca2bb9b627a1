"""Admission by cost: seconds of work, estimated before they are paid, refused at once when the
backlog cannot absorb them in time. Nothing waits in a queue of ours.

A request's cost is the decode work of its images (CPU seconds per encoded byte, learned from
the decodes this process ran, spread over the decode threads) plus the model work (backend busy
seconds per image, learned from the backend calls, or pinned by the operator). A text costs its
tokenisation (a small fixed estimate) plus the text model's busy seconds per text, learned the
same way from the text calls. The backlog is
the cost of everything admitted and not finished. A request is admitted only if the backlog
plus its cost stays within the horizon (by default half the request deadline, so admitted work
finishes in time even when the estimates are off by 2x); otherwise it gets 429 with a
Retry-After of the seconds the backlog needs to drain far enough, at the measured rate.

The decision is made as early as the bytes allow: from ``Content-Length`` before the body is
read (the body's bytes cost at least their decode), then item by item while it streams, so a
body that can no longer be admitted stops being read. Request bodies being received at once are
bounded in bytes too. All access is from the event loop thread: plain numbers suffice.
"""

from __future__ import annotations

import math
import time
from types import TracebackType
from typing import Self

from gateway.errors import LimitExceeded, Overloaded
from gateway.observability.metrics import Metrics

#: Learning rate of the moving averages (a new measurement's weight).
_ALPHA = 0.3
#: Model seconds per image before anything was measured: a slow CPU's ViT-B/32 (20 img/s).
_PRIOR_INFER_S = 0.05
#: Text model seconds per text before anything was measured (ViT-B/32's text tower: ~0.6x the
#: image tower's FLOPs at 77 tokens).
_PRIOR_TEXT_INFER_S = 0.03
#: Tokenisation CPU seconds per text and per character (ftfy + BPE; measured ~30 us for a query).
_TOKENIZE_S_PER_TEXT = 5e-5
_TOKENIZE_S_PER_CHAR = 2e-7
#: Decode CPU seconds per encoded byte before anything was measured (~8 ms per MB) and per item.
_PRIOR_DECODE_S_PER_BYTE = 8e-9
_DECODE_S_PER_ITEM = 3e-4


class Admission:
    def __init__(
        self,
        horizon_s: float,
        decode_threads: int,
        metrics: Metrics,
        *,
        infer_s_per_image: float = 0.0,
        max_body_bytes_in_flight: int = 256 << 20,
    ) -> None:
        self.horizon_s = horizon_s
        self.decode_threads = max(1, decode_threads)
        self.pinned = infer_s_per_image > 0
        self.infer_s = infer_s_per_image if self.pinned else _PRIOR_INFER_S
        self.text_infer_s = _PRIOR_TEXT_INFER_S
        self.decode_s_per_byte = _PRIOR_DECODE_S_PER_BYTE
        self.backlog_s = 0.0
        self.images_in_flight = 0
        self.body_bytes = 0
        self.max_body_bytes = max_body_bytes_in_flight
        self._metrics = metrics
        # backend busy-time accounting (the measured service rates), per model
        self._image_calls = _BusyTime()
        self._text_calls = _BusyTime()

    # --- costs -------------------------------------------------------------------------------
    def image_cost(self, encoded_bytes: int) -> float:
        """Seconds one image of ``encoded_bytes`` adds to the backlog."""
        decode = _DECODE_S_PER_ITEM + self.decode_s_per_byte * encoded_bytes
        return decode / self.decode_threads + self.infer_s

    def text_cost(self, characters: int) -> float:
        """Seconds one text of ``characters`` adds to the backlog."""
        tokenize = _TOKENIZE_S_PER_TEXT + _TOKENIZE_S_PER_CHAR * characters
        return tokenize / self.decode_threads + self.text_infer_s

    def retry_after(self, cost: float) -> float:
        """Seconds until the backlog has drained enough for ``cost`` to fit (backlog drains at
        one second of work per second, the rate the costs are measured in)."""
        return max(1.0, math.ceil(self.backlog_s + cost - self.horizon_s))

    def check(self, cost: float, request_total: float | None = None) -> None:
        """Refuse now if ``cost`` more could not be admitted (nothing is reserved). A request
        whose own total could never fit, even alone, is too large rather than too early."""
        total = cost if request_total is None else request_total
        if total > self.horizon_s:
            raise LimitExceeded(
                f"this request is about {total:.1f} s of work, more than the "
                f"{self.horizon_s:g} s this gateway admits at once; split it",
                cost_s=round(total, 3),
                horizon_s=self.horizon_s,
            )
        if self.backlog_s + cost > self.horizon_s:
            raise Overloaded(
                f"{self.backlog_s:.1f} s of work in flight; {cost:.1f} s more would not finish "
                "within the request deadline",
                retry_after=self.retry_after(cost),
                backlog_s=round(self.backlog_s, 3),
                horizon_s=self.horizon_s,
            )

    def reserve(self, body_bytes: int) -> Reservation:
        """A reservation for one request whose body is ``body_bytes`` long (its Content-Length;
        the body limit when unknown). Refused at once when the bodies being read already hold
        too much memory, or when even this body's decode could not be admitted."""
        if self.body_bytes + body_bytes > self.max_body_bytes:
            raise Overloaded(
                f"{self.body_bytes >> 20} MiB of request bodies are being received; "
                f"{body_bytes >> 20} MiB more do not fit",
                retry_after=1.0,
            )
        self.check(self.image_cost(body_bytes))  # at least one image: its bytes' decode
        return Reservation(self, body_bytes)

    # --- measurements --------------------------------------------------------------------------
    def observe_decode(self, cpu_seconds: float, encoded_bytes: int, items: int) -> None:
        work = cpu_seconds - _DECODE_S_PER_ITEM * items
        if encoded_bytes > 0 and work > 0:
            sample = work / encoded_bytes
            self.decode_s_per_byte += _ALPHA * (sample - self.decode_s_per_byte)

    def infer_started(self, text: bool = False) -> None:
        (self._text_calls if text else self._image_calls).started()

    def infer_finished(self, items: int, text: bool = False) -> None:
        """A backend call ended with ``items`` embedded: one more sample of that model's busy
        seconds per item, once enough work was seen."""
        sample = (self._text_calls if text else self._image_calls).finished(items)
        if sample is None:
            return
        if text:
            self.text_infer_s += _ALPHA * (sample - self.text_infer_s)
        elif not self.pinned:
            self.infer_s += _ALPHA * (sample - self.infer_s)
            self._metrics.infer_seconds_per_image.set(self.infer_s)


class _BusyTime:
    """Busy periods of one model's backend calls (overlapping calls count once): the busy time
    so far divided by the items done is one sample of its service rate."""

    def __init__(self) -> None:
        self.active = 0
        self.since = 0.0
        self.busy_s = 0.0
        self.items = 0

    def started(self) -> None:
        if self.active == 0:
            self.since = time.monotonic()
        self.active += 1

    def finished(self, items: int) -> float | None:
        now = time.monotonic()
        self.busy_s += now - self.since
        self.since = now
        self.active -= 1
        self.items += items
        if self.items < 8 and self.busy_s < 0.5:
            return None
        sample = self.busy_s / self.items if self.items else None
        self.busy_s, self.items = 0.0, 0
        return sample


class Reservation:
    """One request's share of the backlog, grown item by item; released when it is answered."""

    def __init__(self, admission: Admission, body_bytes: int) -> None:
        self.admission = admission
        self.body_bytes = body_bytes
        self.cost = 0.0
        self.images = 0
        admission.body_bytes += body_bytes

    def add_image(self, encoded_bytes: int) -> None:
        """One more image: admitted, or Overloaded (the request stops being read)."""
        self._add(self.admission.image_cost(encoded_bytes))

    def add_text(self, characters: int) -> None:
        """One more text: admitted, or Overloaded."""
        self._add(self.admission.text_cost(characters))

    def _add(self, cost: float) -> None:
        self.admission.check(cost, request_total=self.cost + cost)
        self._hold(cost, images=1)

    def body_read(self) -> None:
        """The body is in: its bytes no longer count against the bodies being received."""
        self.admission.body_bytes -= self.body_bytes
        self.body_bytes = 0

    def _hold(self, cost: float, images: int) -> None:
        admission = self.admission
        admission.backlog_s += cost
        admission.images_in_flight += images
        admission._metrics.inflight.inc(images)
        admission._metrics.backlog_seconds.set(admission.backlog_s)
        self.cost += cost
        self.images += images

    def release(self) -> None:
        admission = self.admission
        self.body_read()
        admission.backlog_s = max(0.0, admission.backlog_s - self.cost)
        admission.images_in_flight -= self.images
        admission._metrics.inflight.dec(self.images)
        admission._metrics.backlog_seconds.set(admission.backlog_s)
        self.cost, self.images = 0.0, 0

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
