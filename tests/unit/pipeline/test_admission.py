"""Admission by cost: estimated seconds of work, refused at once, gauges kept in step."""

from __future__ import annotations

import base64
import math

import numpy as np
import pytest

from clip_gateway.errors import LimitExceeded, Overloaded
from clip_gateway.imaging import work
from clip_gateway.imaging.work import Work
from clip_gateway.observability.metrics import Metrics
from clip_gateway.pipeline.admission import CACHE_HIT_S, MAX_STEP, RATE_BOUNDS, Admission
from clip_gateway.pipeline.cache import Entry
from clip_gateway.pipeline.items import ImageItem, Item, TextItem, price
from tests import samples

#: An image whose decode costs nothing beyond the per-item overhead.
FREE = Work("jpeg", "jpeg-baseline", 0.0)


def priced(seconds: float, coding: str = "webp-lossy") -> Work:
    return Work(coding.split("-")[0], coding, seconds)


def admission(horizon: float = 1.0, infer: float = 0.1, threads: int = 2, **kw: int) -> Admission:
    return Admission(horizon, threads, Metrics(), infer_s_per_image=infer, **kw)


def test_an_image_costs_its_decode_spread_over_the_threads_plus_the_model() -> None:
    a = admission(threads=2, infer=0.1)
    small, big = a.image_cost(priced(0.01)), a.image_cost(priced(0.31))
    assert small == pytest.approx((3e-4 + 0.01) / 2 + 0.1)
    assert big - small == pytest.approx(0.3 / 2)  # the header price, at the learned rate (1x)


def test_reservations_fill_the_horizon_then_refuse_with_a_computed_retry_after() -> None:
    a = admission(horizon=1.0, infer=0.1)
    cost = a.image_cost(FREE)
    fits = math.floor(1.0 / cost)  # 9 images of ~0.10015 s
    with a.reserve(1000) as first, a.reserve(1000) as second:
        assert a.body_bytes_in_flight == 0  # declared, not received: nothing held for it
        first.received(1000)
        second.received(1000)
        for i in range(fits):
            (first if i % 2 else second).add_image(FREE)
        assert a.backlog_s == 0  # bodies still arriving: nothing held yet
        assert a.body_bytes_in_flight == 2000
        first.body_read()
        second.body_read()
        backlog = a.backlog_s
        assert backlog == pytest.approx(fits * cost)
        assert a.items_in_flight == fits
        assert a.body_bytes_in_flight == 0  # both bodies complete
        with pytest.raises(Overloaded) as refused:
            first.add_image(FREE)
        assert refused.value.retry_after == max(1.0, math.ceil(backlog + cost - 1.0))
        assert refused.value.extra == {"backlog_s": round(backlog, 3), "horizon_s": 1.0}
        assert a.backlog_s == backlog and first.items == fits // 2  # a refusal holds nothing
    assert (a.backlog_s, a.items_in_flight, a.body_bytes_in_flight) == (0.0, 0, 0)


def test_the_retry_after_grows_with_the_backlog() -> None:
    a = admission(horizon=1.0, infer=0.45)
    with a.reserve(0) as held:
        held.add_image(FREE)
        held.add_image(FREE)
        held.body_read()  # 0.9 s held: one more image must wait for about 0.35 s to drain
        with pytest.raises(Overloaded) as short:
            a.check(a.image_cost(FREE))
        a.backlog_s += 3.0  # as if three more seconds were admitted elsewhere
        with pytest.raises(Overloaded) as long:
            a.check(a.image_cost(FREE))
        a.backlog_s -= 3.0
    assert short.value.retry_after == 1.0
    assert long.value.retry_after == math.ceil(3.0 + 3 * a.image_cost(FREE) - 1.0) == 4


def test_a_request_that_could_never_fit_is_too_large_not_too_early() -> None:
    a = admission(horizon=1.0, infer=0.4)
    with a.reserve(0) as alone:
        alone.add_image(FREE)
        alone.add_image(FREE)
        with pytest.raises(LimitExceeded, match="split it"):
            alone.add_image(FREE)


def test_the_body_bytes_being_received_are_bounded_by_what_arrived() -> None:
    a = admission(max_body_bytes_in_flight=1000)
    declared = [a.reserve(64 << 20) for _ in range(4)]  # 4 x 64 MiB declared, 1 byte sent
    for stalled in declared:
        stalled.received(1)
    held = a.reserve(800)
    held.received(796)  # 4 + 796 bytes: room for 200 more
    other = a.reserve(300)
    with pytest.raises(Overloaded, match="request bodies"):
        other.received(201)
    other.received(200)  # exactly the bound
    held.body_read()  # the first body is in: its bytes no longer count
    other.received(100)
    for reservation in [held, other, *declared]:
        reservation.release()
    assert a.body_bytes_in_flight == 0


def test_a_body_refusal_says_when_the_oldest_body_in_flight_must_be_complete(
    clock: Clock,
) -> None:
    a = Admission(10.0, 1, Metrics(), max_body_bytes_in_flight=10, body_timeout_s=30.0)
    oldest = a.reserve(None)
    oldest.received(10)
    clock.now += 12.0
    newer = a.reserve(None)
    with pytest.raises(Overloaded) as refused:
        newer.received(1)
    assert refused.value.retry_after == 18  # 30 s body deadline, 12 s gone
    oldest.body_read()  # complete: the next oldest (just started) decides
    newer.received(1)
    other = a.reserve(None)
    with pytest.raises(Overloaded) as again:
        other.received(10)
    assert again.value.retry_after == 30


def test_a_declared_body_too_costly_to_decode_is_refused_before_reading() -> None:
    a = admission(horizon=1.0, infer=0.0001, max_body_bytes_in_flight=1 << 40)
    huge = int(2 * 1.0 * a.decode_threads / 4e-9)  # two horizons at the cheapest byte price
    with pytest.raises(LimitExceeded):
        a.reserve(huge)
    a.reserve(huge // 4).release()  # half a horizon: read it, and price its items
    assert a.body_bytes_in_flight == 0


def test_gauges_follow_the_backlog() -> None:
    metrics = Metrics()
    a = Admission(1.0, 1, metrics, infer_s_per_image=0.1)
    with a.reserve(0) as held:
        held.add_image(FREE)
        assert metrics.inflight._value.get() == 0  # held once the body is complete
        held.body_read()
        assert metrics.inflight._value.get() == 1
        assert metrics.backlog_seconds._value.get() == pytest.approx(a.image_cost(FREE))
    assert metrics.inflight._value.get() == 0
    assert metrics.backlog_seconds._value.get() == 0


def test_the_service_rate_is_learned_from_busy_time_unless_pinned() -> None:
    learned = Admission(10.0, 1, Metrics())
    prior = learned.infer_s
    learned.infer_started()
    learned._image_calls.since -= 0.8  # the call has been busy 0.8 s
    learned.infer_finished(32)
    assert learned.infer_s == pytest.approx(prior + 0.3 * (0.8 / 32 - prior), rel=1e-3)
    pinned = admission(infer=0.2)
    pinned.infer_started()
    pinned.infer_finished(32)
    assert pinned.infer_s == 0.2


def test_the_text_rate_is_learned_from_text_calls_alone() -> None:
    a = Admission(10.0, 1, Metrics(), infer_s_per_image=0.2)
    image_rate, text_prior = a.infer_s, a.text_infer_s
    a.infer_started(text=True)
    a._text_calls.since -= 0.32  # 32 texts in 0.32 s
    a.infer_finished(32, text=True)
    assert a.text_infer_s == pytest.approx(text_prior + 0.3 * (0.01 - text_prior), rel=1e-3)
    assert a.infer_s == image_rate  # the image rate is not touched
    assert a.text_cost(20) < a.image_cost(priced(0.0002))  # a query costs less than a photo
    with a.reserve(0) as held:
        held.add_text(20)
        held.body_read()
        assert a.items_in_flight == 1
        assert a.backlog_s == pytest.approx(a.text_cost(20))


def test_a_text_over_the_horizon_is_refused_like_an_image() -> None:
    a = admission(horizon=1.0)
    with a.reserve(0) as held, pytest.raises(LimitExceeded):
        held.add_text(1_000_000_000)  # ~100 s of tokenising


def test_the_decode_rate_is_learned_per_format_against_the_header_price() -> None:
    a = admission()
    # PNGs that took 1.1x their price, with a full sample's worth of work
    a.observe_decode("png", cpu_seconds=0.22 + 3e-4, priced_s=0.2, items=1)
    assert a.decode_rate["png"] == pytest.approx(1 + 0.3 * (1.1 - 1))
    gauge = a._metrics.decode_rate.labels("png")._value.get()
    assert gauge == pytest.approx(a.decode_rate["png"])  # exported as it is learned
    assert a.decode_rate["jpeg-baseline"] == a.decode_rate["webp-lossy"] == 1.0  # others untouched
    assert a.decode_rate["png-16bit"] == 1.0  # another coding of the same format too
    a.observe_decode("refused", cpu_seconds=1.0, priced_s=0.1, items=1)  # refused: no rate
    assert set(a.decode_rate) == set(work.FACTORS)
    before = a.image_cost(priced(0.2, "png"))
    assert before == pytest.approx((3e-4 + 1.03 * 0.2) / 2 + 0.1)


def test_a_sample_weighs_in_proportion_to_the_work_it_measured() -> None:
    a = admission()
    a.observe_decode("jpeg-baseline", cpu_seconds=0.01 + 3e-4, priced_s=0.005, items=1)  # 2x, 10 ms
    weight = 0.3 * (0.01 + 3e-4) / 0.1
    assert a.decode_rate["jpeg-baseline"] == pytest.approx(1 + weight * (2 - 1))


@pytest.mark.parametrize(("measured_s", "priced_s"), [(30.0, 0.01), (0.2, 1000.0)])
def test_one_extreme_sample_moves_a_rate_by_at_most_a_quarter(
    measured_s: float, priced_s: float
) -> None:
    """A tiny image with a huge canvas, or a decode far cheaper than its price: one sample
    moves the rate by at most MAX_STEP (25 %), however far off it is."""
    a = admission()
    a.observe_decode("webp-lossy", cpu_seconds=measured_s + 3e-4, priced_s=priced_s, items=1)
    assert MAX_STEP == 0.25
    expected = 1.25 if measured_s > 1 else 0.75
    assert a.decode_rate["webp-lossy"] == pytest.approx(expected)


def test_a_poison_sample_does_not_make_a_camera_photo_too_large() -> None:
    """The issue's sequence: one request of a tiny image with a huge canvas, then a 12 MP
    camera photo: admitted, at most a quarter dearer than before."""
    a = Admission(15.0, 2, Metrics(), infer_s_per_image=0.05)
    photo = Work("jpeg", "jpeg-baseline", 0.3e-9 * 12e6 + 8e-9 * 4e6)
    before = a.image_cost(photo)
    a.observe_decode("jpeg-baseline", cpu_seconds=200.0, priced_s=0.001, items=1)
    with a.reserve(4_000_000) as request:
        request.add_image(photo)
    assert a.image_cost(photo) <= before * 1.25


def test_the_learned_rate_stays_within_its_bounds() -> None:
    a = admission()
    for _ in range(100):
        a.observe_decode("gif", cpu_seconds=100.0, priced_s=0.001, items=1)
        a.observe_decode("png", cpu_seconds=0.1 + 3e-4, priced_s=1000.0, items=1)
    assert a.decode_rate["gif"] == RATE_BOUNDS[1]
    assert a.decode_rate["png"] == RATE_BOUNDS[0]


def test_an_unpinned_gateway_starts_from_the_prior_and_one_thread_decodes_alone() -> None:
    a = Admission(1.0, 1, Metrics())
    assert a.infer_s == 0.05 and a.text_infer_s == 0.03
    assert a.image_cost(priced(0.008)) == pytest.approx(3e-4 + 0.008 + 0.05)
    assert Admission(1.0, 0, Metrics()).decode_threads == 1  # never divides by zero


def test_a_text_costs_its_tokenising_spread_over_the_threads_plus_the_text_model() -> None:
    a = admission(threads=4)
    assert a.text_cost(1000) == pytest.approx((5e-5 + 2e-7 * 1000) / 4 + 0.03)


def test_work_that_exactly_fills_the_horizon_is_admitted() -> None:
    a = admission(horizon=1.0)
    a.check(1.0)  # alone, exactly the horizon
    a.backlog_s = 0.5
    a.check(0.5)  # on top of a backlog, exactly the horizon
    with pytest.raises(Overloaded) as overloaded:
        a.check(0.625)
    assert overloaded.value.reason == (
        "0.5 s of work in flight; 0.6 s more would not finish within the request deadline"
    )
    with pytest.raises(LimitExceeded) as too_large:
        a.check(0.1, request_total=1.23456)
    assert too_large.value.extra == {"cost_s": 1.235, "horizon_s": 1.0}
    assert "about 1.2 s of work, more than the 1 s this gateway admits at once" in str(
        too_large.value
    )


def test_bodies_that_exactly_fill_the_byte_bound_are_admitted_and_the_refusal_says_how_much() -> (
    None
):
    mib = 1 << 20
    a = admission(horizon=1e9, max_body_bytes_in_flight=5 * mib)
    held = a.reserve(3 * mib)
    held.received(3 * mib)
    exact = a.reserve(2 * mib)
    exact.received(2 * mib)  # 3 + 2 MiB: exactly the bound
    exact.release()
    with pytest.raises(Overloaded) as refused:
        a.reserve(None).received(2 * mib + 1)
    assert str(refused.value) == (
        "3 MiB of request bodies are being received; 2097153 bytes more do not fit"
    )
    held.release()


def test_decode_samples_without_a_price_or_without_work_teach_nothing() -> None:
    a = admission()
    a.observe_decode("jpeg-baseline", cpu_seconds=1.0, priced_s=0.0, items=1)  # work, but no price
    a.observe_decode("jpeg-baseline", cpu_seconds=3e-4, priced_s=0.1, items=1)  # no work beyond
    assert a.decode_rate["jpeg-baseline"] == 1.0


def test_releasing_twice_gives_back_nothing_more() -> None:
    a = admission()
    other = a.reserve(0)
    other.add_image(FREE)
    other.body_read()
    held = a.reserve(0)
    held.add_image(FREE)
    held.body_read()
    held.release()
    held.release()
    assert a.backlog_s == pytest.approx(a.image_cost(FREE))
    assert a.items_in_flight == 1
    other.release()
    assert (a.backlog_s, a.items_in_flight) == (0.0, 0)


class Clock:
    """time.monotonic for the busy-time accounting, moved by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    from types import SimpleNamespace

    import clip_gateway.pipeline.admission as module

    fake = Clock()
    monkeypatch.setattr(module, "time", SimpleNamespace(monotonic=fake.monotonic))
    return fake


def call(a: Admission, clock: Clock, seconds: float, items: int) -> None:
    a.infer_started()
    clock.now += seconds
    a.infer_finished(items)


def test_overlapping_calls_count_their_busy_time_once(clock: Clock) -> None:
    metrics = Metrics()
    a = Admission(10.0, 1, metrics)
    a.infer_started()  # t=0
    clock.now += 0.1
    a.infer_started()  # t=0.1, while the first is running
    clock.now += 0.2
    a.infer_finished(4)  # t=0.3: 4 items, not yet a sample
    assert a.infer_s == 0.05
    clock.now += 0.3
    a.infer_finished(4)  # t=0.6: 8 items in 0.6 busy seconds
    assert a.infer_s == pytest.approx(0.05 + 0.3 * (0.6 / 8 - 0.05))
    assert metrics.infer_seconds_per_image._value.get() == pytest.approx(a.infer_s)
    # both calls have ended: the idle time before the next one is not busy time
    first = a.infer_s
    clock.now += 50.0
    call(a, clock, 0.08, 8)
    assert a.infer_s == pytest.approx(first + 0.3 * (0.01 - first))


def test_idle_time_between_calls_is_not_busy_time(clock: Clock) -> None:
    a = Admission(10.0, 1, Metrics())
    call(a, clock, 0.2, 4)
    clock.now += 50.0  # idle
    call(a, clock, 0.2, 4)
    assert a.infer_s == pytest.approx(0.05 + 0.3 * (0.4 / 8 - 0.05))
    # the next sample starts afresh: 8 items in 0.08 s
    clock.now += 50.0
    call(a, clock, 0.08, 8)
    first = 0.05 + 0.3 * (0.4 / 8 - 0.05)
    assert a.infer_s == pytest.approx(first + 0.3 * (0.01 - first))


@pytest.mark.parametrize(
    ("seconds", "items", "sampled"),
    [(0.49, 7, False), (0.1, 8, True), (0.5, 7, True), (0.6, 0, False)],
)
def test_a_sample_needs_eight_items_or_half_a_busy_second(
    clock: Clock, seconds: float, items: int, sampled: bool
) -> None:
    a = Admission(10.0, 1, Metrics())
    call(a, clock, seconds, items)
    expected = 0.05 + 0.3 * (seconds / items - 0.05) if sampled else 0.05
    assert a.infer_s == pytest.approx(expected)
    call(a, clock, 0.2, 8)  # the accounting starts afresh after a sample (or an empty one)
    after = expected if sampled or items == 0 else 0.05
    carried = (0.0, 0) if sampled or items == 0 else (seconds, items)
    sample = (0.2 + carried[0]) / (8 + carried[1])
    assert a.infer_s == pytest.approx(after + 0.3 * (sample - after))


def test_one_key_holds_at_most_its_share_while_others_are_admitted() -> None:
    a = Admission(10.0, 1, Metrics(), infer_s_per_image=1.0, key_share=0.5)
    hogs = [a.reserve(None, "hog") for _ in range(5)]
    for request in hogs[:4]:
        request.add_image(FREE)  # ~4 s of its 5 s share, in four requests
        request.body_read()
    with pytest.raises(Overloaded) as refused:
        hogs[4].add_image(FREE)
    held = a.by_key["hog"]
    assert held == pytest.approx(4 * a.image_cost(FREE))
    # computed from its own backlog: what must drain before one more image fits its share
    assert refused.value.retry_after == max(1, math.ceil(held + a.image_cost(FREE) - 5.0))
    assert refused.value.extra["key_share_s"] == 5.0
    other = a.reserve(None, "other")
    for _ in range(4):
        other.add_image(FREE)  # the rest of the horizon is there for the other key
    other.body_read()
    for request in hogs:
        request.release()
    assert "hog" not in a.by_key
    again = a.reserve(None, "hog")
    again.add_image(FREE)  # its share is free again
    again.release()
    other.release()
    assert a.by_key == {} and a.backlog_s == 0


def test_a_request_over_one_keys_share_is_too_large_for_that_key() -> None:
    a = Admission(10.0, 1, Metrics(), infer_s_per_image=2.0, key_share=0.5)
    with a.reserve(None, "k") as request:
        request.add_image(FREE)
        request.add_image(FREE)
        with pytest.raises(LimitExceeded, match="one API key may hold at once"):
            request.add_image(FREE)  # ~6 s: over the 5 s share even alone
    with a.reserve(None) as anonymous:  # no key (a single-key gateway): the whole horizon
        for _ in range(4):
            anonymous.add_image(FREE)


def test_every_429_and_503_says_when_to_retry_computed_from_the_state() -> None:
    from clip_gateway.errors import BackendFailed, BackendUnavailable
    from clip_gateway.http.problems import headers_of

    assert headers_of(Overloaded("full", retry_after=3.2))["Retry-After"] == "4"
    # Triton unavailable or shedding: the worker's backlog must drain, at least the reconnect
    assert headers_of(BackendUnavailable("down"), backlog_s=7.2)["Retry-After"] == "8"
    assert headers_of(BackendUnavailable("down"), backlog_s=0.0)["Retry-After"] == "2"
    assert "Retry-After" not in headers_of(BackendFailed("broken"), backlog_s=7.2)  # a 502


def test_a_body_still_arriving_holds_nothing_others_must_wait_for() -> None:
    """Issue 31: a tiny header priced near the whole horizon, then a body trickled for the whole
    body timeout, held the horizon and every other client got 429. Nothing is decoded before
    the body is complete, so nothing is held before: others are admitted meanwhile, and the
    trickler is checked again, against the backlog then, once its body is in."""
    a = admission(horizon=1.0, infer=0.0)
    trickler = a.reserve(None)
    trickler.add_image(priced(1.5))  # ~0.75 s of the 1 s horizon, its body still arriving
    assert a.backlog_s == 0
    with a.reserve(None) as other:
        other.add_image(priced(1.0))  # 0.5 s: admitted beside it
        other.body_read()
        assert a.backlog_s == pytest.approx(a.image_cost(priced(1.0)))
        with pytest.raises(Overloaded):  # complete now: 0.5 + 0.75 s would not fit
            trickler.body_read()
    trickler.release()
    assert (a.backlog_s, a.items_in_flight) == (0.0, 0)


def test_a_header_over_the_pixel_or_memory_budget_is_priced_at_nothing() -> None:
    """A 45-byte PNG header declaring gigapixels: the decoder refuses it from its header, so
    admission charges it nothing (it used to charge just under the whole horizon)."""
    import struct
    import zlib

    ihdr = struct.pack(">IIBBBBB", 60_000, 55_000, 16, 2, 0, 0, 0)
    png = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr
    png += struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    assert len(png) <= 45
    assert work.estimate(png) == work.REFUSED
    allowed = work.estimate(png, plan=work.Plan(max_pixels=10**10, max_decode_bytes=1 << 40))
    assert allowed.coding == "png-16bit" and allowed.seconds > 10  # what it cost before


def test_admissions_defaults_are_the_pipelines() -> None:
    """Admission built with no limits of its own has the pipeline's (one default per knob)."""
    from clip_gateway.pipeline.service import PipelineOptions

    options = PipelineOptions(request_timeout_s=2.0, decode_threads=1, horizon_s=1.0)
    a = Admission(1.0, 1, Metrics())
    assert (a.body_timeout_s, a.key_share, a.overspend, a.max_body_bytes_in_flight) == (
        options.body_timeout_s,
        options.key_share,
        options.decode_overspend,
        options.max_body_bytes_in_flight,
    )
    assert a.plan is work.DEFAULT_PLAN
    assert a.reserve(0).plan is a.plan


def test_a_body_retry_after_is_never_under_a_second(clock: Clock) -> None:
    a = Admission(10.0, 1, Metrics(), max_body_bytes_in_flight=10)
    assert a.body_retry_after() == 1.0  # no body being received: nothing to wait for
    slow = a.reserve(None)
    slow.received(10)
    assert a.body_retry_after() == 30  # the default body deadline, all of it ahead
    clock.now += 29.5
    with pytest.raises(Overloaded) as refused:
        a.reserve(None).received(1)
    assert refused.value.retry_after == 1.0  # half a second left: rounded up to one
    clock.now += 60.0  # past its deadline (the reader cuts it): still a second, not less
    assert a.body_retry_after() == 1.0


def test_one_keys_share_may_be_filled_exactly_and_its_refusals_say_by_how_much() -> None:
    a = Admission(10.0, 1, Metrics(), key_share=0.5)  # a 5 s share of the 10 s horizon
    a.check(5.0, key="k")  # a request of exactly the share, alone
    with pytest.raises(LimitExceeded) as too_large:
        a.check(0.1, request_total=5.12345, key="k")
    assert str(too_large.value) == (
        "this request is about 5.1 s of work, more than the 5 s one API key may hold at once; "
        "split it"
    )
    assert too_large.value.extra == {"cost_s": 5.123, "key_share_s": 5.0}
    a.by_key["k"] = a.backlog_s = 4.5
    a.check(0.5, key="k")  # on top of the key's backlog, exactly its share
    a.by_key["k"] = a.backlog_s = 4.51234
    with pytest.raises(Overloaded) as refused:
        a.check(4.0, key="k")
    assert refused.value.reason == (
        "this API key has 4.5 s of work in flight; 4.0 s more would pass its share of 5 s"
    )
    assert refused.value.retry_after == 4  # 4.51 + 4 - 5 s must drain from the key's backlog
    assert refused.value.extra == {"key_backlog_s": 4.512, "key_share_s": 5.0}


def test_with_the_whole_horizon_for_each_key_a_keys_refusal_is_the_backlogs() -> None:
    a = Admission(1.0, 1, Metrics())  # key_share 1: no share of its own to check
    a.by_key["k"] = a.backlog_s = 0.75
    with pytest.raises(Overloaded) as refused:
        a.check(0.5, key="k")
    assert refused.value.extra == {"backlog_s": 0.75, "horizon_s": 1.0}


def test_a_declared_body_is_refused_at_the_door_by_its_keys_share_too() -> None:
    a = Admission(1.0, 1, Metrics(), key_share=0.5)
    declared = int(0.75 / 4e-9)  # 0.75 s at the cheapest byte price: within the horizon
    a.reserve(declared).release()  # no key: the whole horizon
    with pytest.raises(LimitExceeded, match="one API key may hold at once"):
        a.reserve(declared, "k")


def test_a_body_of_unknown_length_is_priced_nothing_before_its_items_arrive() -> None:
    a = admission(horizon=1.0)
    a.backlog_s = 1.0  # the horizon exactly full
    with pytest.raises(Overloaded):
        a.reserve(1)  # one declared byte does not fit
    a.reserve(None).release()  # no Content-Length: nothing to price until items are read


def test_the_meter_holds_a_decode_to_its_price_never_below_the_measured_factors() -> None:
    a = admission()
    png, webp = priced(0.2, "png"), priced(0.2, "webp-lossy")
    assert a.meter_cost(png) == pytest.approx(3e-4 + 0.2)
    a.observe_decode("png", cpu_seconds=0.22 + 3e-4, priced_s=0.2, items=1)  # rate 1.03
    assert a.decode_cost(png) == pytest.approx(3e-4 + 1.03 * 0.2)
    assert a.meter_cost(png) == pytest.approx(3e-4 + 1.03 * 0.2)  # a dearer rate: more budget
    a.observe_decode("webp-lossy", cpu_seconds=0.2 + 3e-4, priced_s=1000.0, items=1)  # 0.75
    assert a.decode_cost(webp) == pytest.approx(3e-4 + 0.75 * 0.2)
    assert a.meter_cost(webp) == pytest.approx(3e-4 + 0.2)  # not below the factors
    # an image the decoder refuses from its header: the per-item overhead, no rate of its own
    assert a.decode_cost(work.REFUSED) == a.meter_cost(work.REFUSED) == 3e-4


def test_a_sample_of_several_images_is_net_of_each_ones_overhead() -> None:
    a = admission()
    a.observe_decode("png", cpu_seconds=0.22 + 4 * 3e-4, priced_s=0.2, items=4)
    assert a.decode_rate["png"] == pytest.approx(1 + 0.3 * (1.1 - 1))


def test_a_reservation_prices_its_images_by_its_plan_and_sums_their_decodes() -> None:
    a = admission(horizon=10.0)
    full = work.Plan(full_size=True)  # Immich's full-size decode: no DCT scaling
    photo = ImageItem(data=samples.encode(samples.small_photo(), "JPEG"))
    assert price(photo, full) != price(photo)  # the plan matters to this image
    with a.reserve(0, plan=full) as request:
        assert request.plan is full
        assert (request.decode_s, request.meter_s) == (0.0, 0.0)
        request.add(photo)
        request.add(photo)
        priced_at = price(photo, full)
        assert request.decode_s == pytest.approx(2 * a.decode_cost(priced_at))
        assert request.meter_s == pytest.approx(2 * a.meter_cost(priced_at))
        assert request.pending == pytest.approx(2 * a.image_cost(priced_at))


def test_an_item_the_cache_answers_costs_a_lookup_and_its_key_and_vector_are_kept() -> None:
    a = admission(horizon=1.0, infer=0.1, threads=1)
    hit = ImageItem(data=samples.encode(samples.small_photo(), "JPEG"))
    miss, uncacheable = TextItem("a cat"), TextItem("a dog")
    entry = Entry(np.ones(4, np.float32), width=640, height=480)
    answers: dict[int, tuple[bytes, Entry | None]] = {
        id(hit): (b"hit", entry),
        id(miss): (b"miss", None),
    }
    asked: list[Item] = []

    def probe(item: Item) -> tuple[bytes, Entry | None] | None:
        asked.append(item)
        return answers.get(id(item))

    with a.reserve(0) as request:
        request.probe = probe
        request.add(hit)
        assert request.pending == CACHE_HIT_S
        assert request.decode_s == 0.0  # answered: nothing to decode
        request.add(miss)  # cacheable, not cached: priced as a text
        request.add(uncacheable)
        assert asked == [hit, miss, uncacheable]
        assert request.pending == pytest.approx(CACHE_HIT_S + 2 * a.text_cost(5))
        assert request.keys == {id(hit): b"hit", id(miss): b"miss"}
        assert list(request.hits) == [id(hit)] and request.hits[id(hit)] is entry
        assert request.items == 3


def test_items_added_after_the_body_is_complete_are_held_at_once_and_released_in_full() -> None:
    a = admission(horizon=1.0, infer=0.3, threads=1)
    cost = a.image_cost(FREE)  # ~0.3 s: three fit the horizon, four do not
    with a.reserve(0) as request:
        request.body_read()  # no items yet: nothing held
        for added in (1, 2, 3):
            request.add_image(FREE)
            assert (a.items_in_flight, request.items) == (added, added)
            assert request.cost == pytest.approx(added * cost) == a.backlog_s
        with pytest.raises(LimitExceeded, match="split it"):  # the request's own total
            request.add_image(FREE)
    assert (a.backlog_s, a.items_in_flight) == (0.0, 0)
    assert (request.cost, request.pending, request.items) == (0.0, 0.0, 0)


def test_a_request_released_while_its_body_arrives_holds_nothing_after() -> None:
    a = admission(horizon=1.0, infer=0.1)
    request = a.reserve(10)
    request.received(10)
    request.add_image(FREE)
    request.release()  # refused or gone mid-body
    assert (request.pending, request.items) == (0.0, 0)  # nothing left to admit or embed
    request.body_read()  # the reader's own completion, after
    assert (a.backlog_s, a.items_in_flight, a.body_bytes_in_flight) == (0.0, 0, 0)


def test_releasing_one_request_of_a_key_leaves_its_others_counted() -> None:
    a = Admission(10.0, 1, Metrics(), infer_s_per_image=0.2, key_share=0.5)
    first, second = a.reserve(None, "k"), a.reserve(None, "k")
    first.add_image(FREE)
    first.body_read()
    second.add_image(FREE)
    second.add_image(FREE)
    second.body_read()
    cost = a.image_cost(FREE)
    assert a.by_key == {"k": pytest.approx(3 * cost)}
    first.release()
    assert a.by_key == {"k": pytest.approx(2 * cost)}
    second.release()
    assert a.by_key == {}


def test_a_keys_body_completed_after_its_share_filled_is_refused_by_the_share() -> None:
    """The trickler of issue 31, per key: checked again once complete, against its key's
    backlog then (the horizon itself still has room)."""
    a = Admission(10.0, 1, Metrics(), infer_s_per_image=2.0, key_share=0.5)
    trickler = a.reserve(None, "k")
    trickler.add_image(FREE)  # ~2 s, its body still arriving
    with a.reserve(None, "k") as other:
        other.add_image(FREE)
        other.add_image(FREE)
        other.body_read()  # ~4 s of the key's 5 s share held
        with pytest.raises(Overloaded) as refused:
            trickler.body_read()
        assert refused.value.extra["key_share_s"] == 5.0
    trickler.release()
    assert (a.backlog_s, a.by_key) == (0.0, {})


def test_each_raw_jpegs_price_is_kept_for_its_decode_with_the_header_it_walked() -> None:
    """What the decode may take instead of walking again: the price of a raw JPEG walked whole,
    by the item's id; not a base64 item's (only its prefix was read), a PNG's or a text's."""
    a = admission(horizon=100.0)
    raw, other = ImageItem(samples.compact(0)), ImageItem(samples.compact(1))
    b64 = ImageItem.from_base64(base64.b64encode(samples.compact(2)).decode())
    png, text = ImageItem(samples.png(3)), TextItem("a cat")
    with a.reserve(None) as reservation:
        for item in (raw, b64, png, text, other):
            reservation.add(item)
        assert reservation.priced == {id(raw): price(raw), id(other): price(other)}
        assert reservation.priced[id(raw)].layout is not None


def test_url_bodies_stay_counted_while_the_requests_other_items_are_added() -> None:
    """A request whose URL items are fetched after its body: each fetched item is priced as
    it arrives, and the bytes of the fetches still streaming stay counted until the last is
    in (issue 42: a finished URL item used to uncount them all)."""
    a = admission(horizon=10.0, max_body_bytes_in_flight=1000)
    with a.reserve(None) as request:
        request.body_read()  # the JSON body, read
        request.receiving()  # its URL items being fetched
        request.received(600)  # one fetch's bytes so far
        request.add(ImageItem(samples.compact(1)))  # another fetch finished
        assert a.body_bytes_in_flight == 600 and a.backlog_s == 0.0  # not held yet
        with pytest.raises(Overloaded, match="request bodies"):
            a.reserve(None).received(401)
        request.released(100)  # a fetch that failed: its bytes given back
        assert (request.body_bytes, a.body_bytes_in_flight) == (500, 500)
        request.body_read()  # the last fetch is done: bytes uncounted, costs held
        assert a.body_bytes_in_flight == 0 and a.backlog_s > 0
    assert (a.backlog_s, a.body_bytes_in_flight) == (0.0, 0)


def test_releasing_more_than_was_received_gives_back_only_what_was() -> None:
    a = admission(max_body_bytes_in_flight=1000)
    other, request = a.reserve(None), a.reserve(None)
    other.received(300)
    request.received(200)
    request.released(500)
    assert (request.body_bytes, a.body_bytes_in_flight) == (0, 300)


def test_a_url_item_that_gave_no_image_costs_no_model_work() -> None:
    from clip_gateway.errors import UrlFailed

    a = admission(horizon=10.0, infer=1.0)
    with a.reserve(None) as request:
        for _ in range(9):
            request.add(ImageItem(url="http://x.example/", error=UrlFailed("dead")))
        request.body_read()
        assert request.cost == pytest.approx(9 * CACHE_HIT_S)  # nine model calls: 9 s before


def test_rates_start_at_this_machines_decode_speed_and_are_bounded_by_it() -> None:
    """Issue 42: the factors were measured on another CPU. A coding measured 2.5x slower here
    is priced 2.5x from the first request (the gauge says so), learns within RATE_BOUNDS of
    that speed, and a coding not measured keeps the factors."""
    a = Admission(1.0, 2, Metrics(), decode_speed={"jpeg-progressive": 2.5, "png": 0.5})
    strip, photo = priced(0.04, "jpeg-progressive"), priced(0.2, "webp-lossy")
    assert a.decode_cost(strip) == pytest.approx(3e-4 + 2.5 * 0.04)
    assert a.decode_cost(photo) == pytest.approx(3e-4 + 0.2)  # not measured: the factors
    assert a.decode_cost(priced(0.2, "png")) == pytest.approx(3e-4 + 0.5 * 0.2)
    gauge = a._metrics.decode_rate.labels("jpeg-progressive")._value.get()
    assert (gauge, a.decode_rate["jpeg-progressive"]) == (2.5, 2.5)
    for _ in range(100):  # far slower still, then far faster: held within the bounds of 2.5
        a.observe_decode("jpeg-progressive", cpu_seconds=100.0, priced_s=0.001, items=1)
    assert a.decode_rate["jpeg-progressive"] == pytest.approx(2.5 * RATE_BOUNDS[1])
    for _ in range(100):
        a.observe_decode("jpeg-progressive", cpu_seconds=0.1 + 3e-4, priced_s=1000.0, items=1)
    assert a.decode_rate["jpeg-progressive"] == pytest.approx(2.5 * RATE_BOUNDS[0])


def test_the_meter_holds_a_decode_to_this_machines_speed_when_it_is_slower() -> None:
    """A machine 2.5x slower than the factors: the meter allows 2.5x the factors' price (3x of
    that before it stops a request), even once the rate has learned less; a faster machine's
    speed never makes the meter stricter than the factors."""
    a = Admission(1.0, 2, Metrics(), decode_speed={"jpeg-progressive": 2.5, "png": 0.5})
    strip, png = priced(0.04, "jpeg-progressive"), priced(0.2, "png")
    assert a.meter_cost(strip) == pytest.approx(3e-4 + 2.5 * 0.04)
    a.decode_rate["jpeg-progressive"] = 1.0  # learned from fast decodes since
    assert a.meter_cost(strip) == pytest.approx(3e-4 + 2.5 * 0.04)
    a.decode_rate["jpeg-progressive"] = 4.0  # learned from slow ones: more budget
    assert a.meter_cost(strip) == pytest.approx(3e-4 + 4.0 * 0.04)
    assert a.decode_cost(png) == pytest.approx(3e-4 + 0.5 * 0.2)  # priced at its speed...
    assert a.meter_cost(png) == pytest.approx(3e-4 + 0.2)  # ...metered at the factors at least
