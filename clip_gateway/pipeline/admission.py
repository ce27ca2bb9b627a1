"""Admission by cost: seconds of work, estimated before they are paid, refused at once when the
backlog cannot absorb them in time. Nothing waits in a queue of ours.

A request's cost is the decode work of its images plus the model work. Decode work is priced
from each image's header before anything is decoded (imaging/work.py: source pixels and encoded
bytes times a measured factor per format and coding, so a 300-byte file that decodes to 30 MP
costs what its decode costs), for the decode plan that will run (the target size, the DCT scale,
Immich's full-size decode), times a rate learned per coding from the decodes this process ran,
spread over the decode threads. The rates start at this machine's decode speed, measured once
per machine against the factors at the HTTP process's start (pipeline/decode_speed.py: the
factors were measured on another CPU). One sample moves a coding's rate by at most ``MAX_STEP``,
in proportion to the work it measured, and the rate stays within ``RATE_BOUNDS`` of that speed:
one odd image cannot make every later photo look unaffordable. A price is a promise the
decode is held to: each request's decodes are metered as they run (pipeline/batching.py), and a
request that spends more than ``overspend`` times its decode price is stopped. Model work is the
backend busy seconds per image, learned from the backend calls (or pinned by the operator). A
text costs its tokenisation (a small fixed estimate) plus the text model's busy seconds per
text, learned the same way. The backlog is the cost of everything admitted and not finished. A
request is admitted only if the backlog plus its cost stays within the horizon (by default half
the request deadline, so admitted work finishes in time even when the estimates are off by 2x);
otherwise it gets 429 with a Retry-After of the seconds the backlog needs to drain far enough.

With several API keys, one key's admitted work is capped at ``key_share`` of the horizon (there is
no queue to see who waits, so the cap always holds: the rest of the horizon stays free for the
other keys); beyond it that key gets 429 with the seconds its own backlog needs to drain.

The decision is made as early as the bytes allow: from ``Content-Length`` before the body is
read (its bytes cost at least ``MIN_DECODE_S_PER_BYTE``), then item by item while it streams,
so a body that can no longer be admitted stops being read. What a request's items cost is held
(counted against everyone else) only once its body is complete: nothing is decoded before that,
so a body that trickles in cannot hold the horizon it has not begun to use; at completion the
whole request is checked against the backlog again. Request bodies being received are
bounded in bytes too, counted as they arrive (never by what a header declares); a refusal says
when the oldest body in flight must be complete. All access is from the event loop thread:
plain numbers suffice.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Self

from clip_gateway.errors import LimitExceeded, Overloaded
from clip_gateway.imaging import work as _work
from clip_gateway.imaging.preprocess import Variant
from clip_gateway.imaging.work import Work
from clip_gateway.observability.metrics import Metrics
from clip_gateway.pipeline.cache import Entry
from clip_gateway.pipeline.items import Item, TextItem, price

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
#: Decode CPU seconds per item whatever its size (sniffing, headers, the pool hop).
_DECODE_S_PER_ITEM = 3e-4
#: A declared body costs at least this per byte (below every format's measured byte factor).
MIN_DECODE_S_PER_BYTE = 4e-9
#: What an item the embedding cache answers costs (a lookup: no decode, no model call); a URL
#: item whose fetch gave no image costs the same (its error is its answer; the fetch cost the
#: time it held a fetch slot, which the slots' shares bound, http/urls/slots.py).
CACHE_HIT_S = 1e-5
#: Codings whose decode rate is learned (multipliers of imaging/work.py's measured factors).
CODINGS = tuple(_work.FACTORS)
#: What a request may spend on decodes: at least this many CPU seconds, whatever its price
#: (a first decode's page faults and cold caches are not the input's doing: a fresh worker's
#: first request of 8 photos, priced 6 ms and warmed, spent 23 ms on a loaded 2-core VM).
METER_FLOOR_S = 0.05
#: One sample moves a format's rate by at most this fraction...
MAX_STEP = 0.25
#: ...and only in proportion to the CPU seconds it measured, up to this much (full weight).
FULL_WEIGHT_S = 0.1
#: The learned rate stays within these multiples of this machine's speed (of the factors where
#: none was measured).
RATE_BOUNDS = (0.25, 8.0)


class Admission:
    def __init__(
        self,
        horizon_s: float,
        decode_threads: int,
        metrics: Metrics,
        *,
        infer_s_per_image: float = 0.0,
        max_body_bytes_in_flight: int = 256 << 20,
        body_timeout_s: float = 30.0,
        key_share: float = 1.0,
        overspend: float = 3.0,
        decode_speed: Mapping[str, float] | None = None,
    ) -> None:
        self.horizon_s = horizon_s
        self.decode_threads = max(1, decode_threads)
        self.pinned = infer_s_per_image > 0
        self.infer_s = infer_s_per_image if self.pinned else _PRIOR_INFER_S
        self.text_infer_s = _PRIOR_TEXT_INFER_S
        #: Per coding: this machine's decode seconds per second of the factors' price, measured
        #: at start (pipeline/decode_speed.py); 1 where none was (the factors as they are).
        self.decode_speed = {c: (decode_speed or {}).get(c, 1.0) for c in CODINGS}
        #: Per coding: measured decode seconds per second of header price, from that speed on.
        self.decode_rate = dict(self.decode_speed)
        for coding, rate in self.decode_rate.items():
            metrics.decode_rate.labels(coding).set(rate)
        #: A request is stopped once its decodes spent this multiple of their price.
        self.overspend = overspend
        #: How admission prices an image's decode (the served model's input size and resize).
        self.plan = _work.DEFAULT_PLAN
        self.backlog_s = 0.0
        self.items_in_flight = 0
        #: Bytes of the request bodies being received, all requests together, and their bound.
        self.body_bytes_in_flight = 0
        self.max_body_bytes_in_flight = max_body_bytes_in_flight
        self.body_timeout_s = body_timeout_s
        self.key_share = key_share
        #: Backlog seconds held per API key (only keys with work in flight).
        self.by_key: dict[str, float] = {}
        #: Reservations whose body is being received, and when each started.
        self._receiving: dict[Reservation, float] = {}
        self._metrics = metrics
        # backend busy-time accounting (the measured service rates), per model
        self._image_calls = _BusyTime()
        self._text_calls = _BusyTime()

    # --- costs -------------------------------------------------------------------------------
    def decode_cost(self, work: Work) -> float:
        """CPU seconds one image of header price ``work`` is expected to decode in."""
        return _DECODE_S_PER_ITEM + self.decode_rate.get(work.coding, 1.0) * work.seconds

    def meter_cost(self, work: Work) -> float:
        """What the meter holds one image's decode to: its price, but never at a rate below the
        factors nor below this machine's measured speed (a machine that decodes faster than
        they say learns a rate under either; that must not make the backstop stricter than
        they are, or a loaded machine's slower decodes of the same images would be stopped as
        overspent; a slower machine's speed over 1 raises it)."""
        rate = max(self.decode_rate.get(work.coding, 1.0), self.decode_speed.get(work.coding, 1.0))
        return _DECODE_S_PER_ITEM + max(rate, 1.0) * work.seconds

    def image_cost(self, work: Work) -> float:
        """Seconds one image of header price ``work`` adds to the backlog."""
        return self.decode_cost(work) / self.decode_threads + self.infer_s

    def text_cost(self, characters: int) -> float:
        """Seconds one text of ``characters`` adds to the backlog."""
        tokenize = _TOKENIZE_S_PER_TEXT + _TOKENIZE_S_PER_CHAR * characters
        return tokenize / self.decode_threads + self.text_infer_s

    def retry_after(self, cost: float) -> float:
        """Seconds until the backlog has drained enough for ``cost`` to fit (backlog drains at
        one second of work per second, the rate the costs are measured in)."""
        return max(1.0, math.ceil(self.backlog_s + cost - self.horizon_s))

    def check(
        self, cost: float, request_total: float | None = None, key: str | None = None
    ) -> None:
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
        if key is not None and self.key_share < 1.0:
            self._check_share(cost, total, key)
        if self.backlog_s + cost > self.horizon_s:
            raise Overloaded(
                f"{self.backlog_s:.1f} s of work in flight; {cost:.1f} s more would not finish "
                "within the request deadline",
                retry_after=self.retry_after(cost),
                backlog_s=round(self.backlog_s, 3),
                horizon_s=self.horizon_s,
            )

    def _check_share(self, cost: float, total: float, key: str) -> None:
        share = self.key_share * self.horizon_s
        if total > share:
            raise LimitExceeded(
                f"this request is about {total:.1f} s of work, more than the {share:g} s one "
                "API key may hold at once; split it",
                cost_s=round(total, 3),
                key_share_s=share,
            )
        held = self.by_key.get(key, 0.0)
        if held + cost > share:
            raise Overloaded(
                f"this API key has {held:.1f} s of work in flight; {cost:.1f} s more would "
                f"pass its share of {share:g} s",
                retry_after=max(1.0, math.ceil(held + cost - share)),
                key_backlog_s=round(held, 3),
                key_share_s=share,
            )

    def reserve(
        self, declared_bytes: int | None, key: str | None = None, plan: _work.Plan | None = None
    ) -> Reservation:
        """A reservation for one request whose body is declared ``declared_bytes`` long (its
        Content-Length, if any), whose images will be decoded by ``plan`` (default: admission's
        own). Refused at once when even those bytes' cheapest decode could not be admitted;
        nothing is held for them until they arrive."""
        floor = (declared_bytes or 0) * MIN_DECODE_S_PER_BYTE / self.decode_threads
        self.check(floor, key=key)
        return Reservation(self, key, plan or self.plan)

    def body_retry_after(self) -> float:
        """Seconds until the oldest body being received must be complete (or cut)."""
        if not self._receiving:
            return 1.0
        oldest = min(self._receiving.values())
        return max(1.0, math.ceil(oldest + self.body_timeout_s - time.monotonic()))

    # --- measurements --------------------------------------------------------------------------
    def observe_decode(self, coding: str, cpu_seconds: float, priced_s: float, items: int) -> None:
        """Decodes of ``items`` images of ``coding`` took ``cpu_seconds``; their header price
        was ``priced_s``. Moves that coding's rate towards what they measured, weighted by the
        work measured and by at most ``MAX_STEP``."""
        work = cpu_seconds - _DECODE_S_PER_ITEM * items
        rate = self.decode_rate.get(coding)
        if rate is None or priced_s <= 0 or work <= 0:
            return
        weight = _ALPHA * min(1.0, cpu_seconds / FULL_WEIGHT_S)
        moved = rate + weight * (work / priced_s - rate)
        moved = min(max(moved, rate * (1 - MAX_STEP)), rate * (1 + MAX_STEP))
        low, high = (bound * self.decode_speed[coding] for bound in RATE_BOUNDS)
        self.decode_rate[coding] = min(max(moved, low), high)
        self._metrics.decode_rate.labels(coding).set(self.decode_rate[coding])

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


#: The cache's answer for an item: its key and its entry when cached; None: not cacheable.
Probe = Callable[[Item], tuple[bytes, Entry | None] | None]


class Reservation:
    """One request's share of the backlog, grown item by item and held once its body is
    complete, and the body bytes it has received so far; released when it is answered."""

    def __init__(
        self, admission: Admission, key: str | None = None, plan: _work.Plan | None = None
    ) -> None:
        self.admission = admission
        self.key = key
        self.plan = plan or admission.plan
        self.body_bytes = 0
        #: Backlog seconds held (once the body is complete), and those priced before that.
        self.cost = 0.0
        self.pending = 0.0
        #: Items (images and texts) admitted, held or pending, and those held.
        self.items = 0
        self._held_items = 0
        #: The CPU seconds its images' decodes were priced at, and what the meter holds them
        #: to (``Admission.meter_cost``).
        self.decode_s = 0.0
        self.meter_s = 0.0
        #: Whose preprocessing the request's items get, decided once at admission (the
        #: service's ``admit`` sets it): its images are priced, looked up and decoded so.
        self.variant: Variant = "open_clip"
        #: The embedding cache's lookup for this request's model and preprocessing (the
        #: service sets it): an item it answers is priced as a lookup, not a decode.
        self.probe: Probe | None = None
        #: What the probe found, by the item's ``id``: its cache key, and the entry on a hit.
        self.keys: dict[int, bytes] = {}
        self.hits: dict[int, Entry] = {}
        #: Each image's price, by the item's ``id``, when it holds what the decoder would read
        #: again (a JPEG walked whole): the decode takes it under the same plan.
        self.priced: dict[int, Work] = {}
        admission._receiving[self] = time.monotonic()

    def received(self, count: int) -> None:
        """``count`` more body bytes arrived: refused (Overloaded) when the bodies being
        received would hold more than the bound."""
        admission = self.admission
        in_flight = admission.body_bytes_in_flight
        if in_flight + count > admission.max_body_bytes_in_flight:
            raise Overloaded(
                f"{in_flight >> 20} MiB of request bodies are being received; "
                f"{count} bytes more do not fit",
                retry_after=admission.body_retry_after(),
            )
        admission.body_bytes_in_flight += count
        self.body_bytes += count

    def released(self, count: int) -> None:
        """``count`` of the body bytes counted by ``received`` are no longer held (a URL
        item's fetch that failed, or the chunks a fetched body was joined from)."""
        count = min(count, self.body_bytes)
        self.admission.body_bytes_in_flight -= count
        self.body_bytes -= count

    def receiving(self) -> None:
        """More body bytes are coming after the body (its URL items being fetched): counted
        as they arrive, and the items added meanwhile priced and held together, as a body's
        are, at the next ``body_read``."""
        self.admission._receiving.setdefault(self, time.monotonic())

    def add(self, item: Item) -> None:
        """One more item of the request, as soon as it is read: a text priced by its length,
        an image by the decode work its header promises under the request's plan. Admitted, or
        refused (the request stops being read). One the cache answers costs a lookup."""
        if self.probe is not None:
            found = self.probe(item)
            if found is not None:
                key, entry = found
                self.keys[id(item)] = key
                if entry is not None:
                    self.hits[id(item)] = entry
                    self._add(CACHE_HIT_S)
                    return
        if isinstance(item, TextItem):
            self.add_text(len(item.text))
            return
        if item.error is not None:  # a URL item that gave no image: nothing to decode or run
            self._add(CACHE_HIT_S)
            return
        work = price(item, self.plan)
        self.add_image(work)
        if work.layout is not None and item.b64 is None:  # base64: only its prefix was read
            self.priced[id(item)] = work

    def add_image(self, work: Work) -> None:
        """One more image: admitted, or Overloaded (the request stops being read)."""
        self._add(self.admission.image_cost(work))
        self.decode_s += self.admission.decode_cost(work)
        self.meter_s += self.admission.meter_cost(work)

    def add_text(self, characters: int) -> None:
        """One more text: admitted, or Overloaded."""
        self._add(self.admission.text_cost(characters))

    def _add(self, cost: float) -> None:
        total = self.cost + self.pending + cost
        self.admission.check(self.pending + cost, request_total=total, key=self.key)
        self.pending += cost
        self.items += 1
        if self not in self.admission._receiving:
            self.body_read()  # added after the body was complete: held at once

    def body_read(self) -> None:
        """The body is in: its bytes no longer count against the bodies being received, and
        what its items cost is held, if the backlog can still take it (else Overloaded)."""
        self._stop_receiving()
        if self.pending:
            self.admission.check(self.pending, request_total=self.cost + self.pending,
                                 key=self.key)  # fmt: skip
            self._hold(self.pending, items=self.items - self._held_items)
            self.pending = 0.0

    def _stop_receiving(self) -> None:
        self.admission.body_bytes_in_flight -= self.body_bytes
        self.body_bytes = 0
        self.admission._receiving.pop(self, None)

    def _hold(self, cost: float, items: int) -> None:
        admission = self.admission
        admission.backlog_s += cost
        admission.items_in_flight += items
        if self.key is not None:
            admission.by_key[self.key] = admission.by_key.get(self.key, 0.0) + cost
        admission._metrics.inflight.inc(items)
        admission._metrics.backlog_seconds.set(admission.backlog_s)
        self.cost += cost
        self._held_items += items

    def release(self) -> None:
        admission = self.admission
        self._stop_receiving()
        self.pending = 0.0
        left = admission.backlog_s - self.cost
        admission.backlog_s = left if left > 1e-9 else 0.0  # no float residue left held
        admission.items_in_flight -= self._held_items
        if self.key is not None and self.cost:
            left = admission.by_key.get(self.key, 0.0) - self.cost
            if left > 1e-9:
                admission.by_key[self.key] = left
            else:
                admission.by_key.pop(self.key, None)
        admission._metrics.inflight.dec(self._held_items)
        admission._metrics.backlog_seconds.set(admission.backlog_s)
        self.cost, self.items, self._held_items = 0.0, 0, 0

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
