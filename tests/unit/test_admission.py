"""Admission by cost: estimated seconds of work, refused at once, gauges kept in step."""

from __future__ import annotations

import math

import pytest

from gateway.errors import LimitExceeded, Overloaded
from gateway.observability.metrics import Metrics
from gateway.pipeline.admission import Admission


def admission(horizon: float = 1.0, infer: float = 0.1, threads: int = 2, **kw: int) -> Admission:
    return Admission(horizon, threads, Metrics(), infer_s_per_image=infer, **kw)


def test_an_image_costs_its_decode_spread_over_the_threads_plus_the_model() -> None:
    a = admission(threads=2, infer=0.1)
    small, big = a.image_cost(10_000), a.image_cost(10_000_000)
    assert small == pytest.approx((3e-4 + 8e-9 * 10_000) / 2 + 0.1)
    assert big - small == pytest.approx(8e-9 * 9_990_000 / 2)  # bytes-proportional decode


def test_reservations_fill_the_horizon_then_refuse_with_a_computed_retry_after() -> None:
    a = admission(horizon=1.0, infer=0.1)
    cost = a.image_cost(0)
    fits = math.floor(1.0 / cost)  # 9 images of ~0.10015 s
    with a.reserve(1000) as first, a.reserve(1000) as second:
        for i in range(fits):
            (first if i % 2 else second).add_image(0)
        backlog = a.backlog_s
        assert backlog == pytest.approx(fits * cost)
        assert a.images_in_flight == fits
        assert a.body_bytes == 2000
        with pytest.raises(Overloaded) as refused:
            first.add_image(0)
        assert refused.value.retry_after == max(1.0, math.ceil(backlog + cost - 1.0))
        assert refused.value.extra == {"backlog_s": round(backlog, 3), "horizon_s": 1.0}
        assert a.backlog_s == backlog and first.images == fits // 2  # a refusal holds nothing
    assert (a.backlog_s, a.images_in_flight, a.body_bytes) == (0.0, 0, 0)


def test_the_retry_after_grows_with_the_backlog() -> None:
    a = admission(horizon=1.0, infer=0.45)
    with a.reserve(0) as held:
        held.add_image(0)
        held.add_image(0)  # 0.9 s held: one more image must wait for about 0.35 s to drain
        with pytest.raises(Overloaded) as short:
            a.check(a.image_cost(0))
        a.backlog_s += 3.0  # as if three more seconds were admitted elsewhere
        with pytest.raises(Overloaded) as long:
            a.check(a.image_cost(0))
        a.backlog_s -= 3.0
    assert short.value.retry_after == 1.0
    assert long.value.retry_after == math.ceil(3.0 + 3 * a.image_cost(0) - 1.0) == 4


def test_a_request_that_could_never_fit_is_too_large_not_too_early() -> None:
    a = admission(horizon=1.0, infer=0.4)
    with a.reserve(0) as alone:
        alone.add_image(0)
        alone.add_image(0)
        with pytest.raises(LimitExceeded, match="split it"):
            alone.add_image(0)


def test_the_body_bytes_being_received_are_bounded() -> None:
    a = admission(max_body_bytes_in_flight=1000)
    held = a.reserve(800)
    with pytest.raises(Overloaded, match="request bodies"):
        a.reserve(300)
    held.body_read()  # the first body is in: its bytes no longer count
    a.reserve(300).release()
    held.release()
    assert a.body_bytes == 0


def test_a_declared_body_too_costly_to_decode_is_refused_before_reading() -> None:
    a = admission(horizon=1.0, infer=0.0001, max_body_bytes_in_flight=1 << 40)
    huge = int(2 * 1.0 * a.decode_threads / 8e-9)  # two horizons of decode work alone
    with pytest.raises(LimitExceeded):
        a.reserve(huge)
    assert a.body_bytes == 0


def test_gauges_follow_the_backlog() -> None:
    metrics = Metrics()
    a = Admission(1.0, 1, metrics, infer_s_per_image=0.1)
    with a.reserve(0) as held:
        held.add_image(0)
        assert metrics.inflight._value.get() == 1
        assert metrics.backlog_seconds._value.get() == pytest.approx(a.image_cost(0))
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
    assert a.text_cost(20) < a.image_cost(20_000)  # a query costs less than a photo
    with a.reserve(0) as held:
        held.add_text(20)
        assert a.images_in_flight == 1  # items: texts count too
        assert a.backlog_s == pytest.approx(a.text_cost(20))


def test_a_text_over_the_horizon_is_refused_like_an_image() -> None:
    a = admission(horizon=1.0)
    with a.reserve(0) as held, pytest.raises(LimitExceeded):
        held.add_text(1_000_000_000)  # ~100 s of tokenising


def test_decode_cost_is_learned_per_byte() -> None:
    a = admission()
    before = a.decode_s_per_byte
    a.observe_decode(cpu_seconds=0.1 + 3e-4, encoded_bytes=1_000_000, items=1)
    assert a.decode_s_per_byte == pytest.approx(before + 0.3 * (1e-7 - before))
    a.observe_decode(cpu_seconds=0.0, encoded_bytes=0, items=0)  # nothing to learn from
    assert a.decode_s_per_byte == pytest.approx(before + 0.3 * (1e-7 - before))


def test_an_unpinned_gateway_starts_from_the_prior_and_one_thread_decodes_alone() -> None:
    a = Admission(1.0, 1, Metrics())
    assert a.infer_s == 0.05 and a.text_infer_s == 0.03
    assert a.image_cost(1_000_000) == pytest.approx(3e-4 + 8e-9 * 1_000_000 + 0.05)
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
    a.reserve(2 * mib).release()  # 3 + 2 MiB: exactly the bound
    with pytest.raises(Overloaded) as refused:
        a.reserve(2 * mib + 1)
    assert str(refused.value) == (
        "3 MiB of request bodies are being received; 2 MiB more do not fit"
    )
    assert refused.value.retry_after == 1.0
    held.release()


def test_decode_samples_without_bytes_or_without_work_teach_nothing() -> None:
    a = admission()
    before = a.decode_s_per_byte
    a.observe_decode(cpu_seconds=1.0, encoded_bytes=0, items=1)  # work, but no bytes
    a.observe_decode(cpu_seconds=3e-4, encoded_bytes=1000, items=1)  # bytes, no work beyond
    assert a.decode_s_per_byte == before
    a.observe_decode(cpu_seconds=3e-4 + 1e-6, encoded_bytes=1, items=1)  # one byte is a sample
    assert a.decode_s_per_byte == pytest.approx(before + 0.3 * (1e-6 - before))


def test_releasing_twice_gives_back_nothing_more() -> None:
    a = admission()
    other = a.reserve(0)
    other.add_image(0)
    held = a.reserve(0)
    held.add_image(0)
    held.release()
    held.release()
    assert a.backlog_s == pytest.approx(a.image_cost(0))
    assert a.images_in_flight == 1
    other.release()
    assert (a.backlog_s, a.images_in_flight) == (0.0, 0)


class Clock:
    """time.monotonic for the busy-time accounting, moved by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    from types import SimpleNamespace

    import gateway.pipeline.admission as module

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
