"""The in-flight image budget: non-blocking, exact accounting, gauge kept in step."""

from __future__ import annotations

import pytest

from gateway.errors import LimitExceeded, Overloaded
from gateway.observability.metrics import Metrics
from gateway.pipeline.admission import ImageBudget


def test_budget_admits_until_full_and_releases_on_exit() -> None:
    metrics = Metrics()
    budget = ImageBudget(10, metrics)
    with budget.admit(6), budget.admit(4):
        assert budget.in_flight == 10
        assert metrics.inflight._value.get() == 10
        with pytest.raises(Overloaded) as refused, budget.admit(1):
            pass
        assert refused.value.retry_after == 1
    assert budget.in_flight == 0
    assert metrics.inflight._value.get() == 0


def test_release_happens_when_the_work_fails() -> None:
    budget = ImageBudget(4, Metrics())
    with pytest.raises(RuntimeError), budget.admit(3):
        raise RuntimeError("boom")
    assert budget.in_flight == 0


def test_larger_than_capacity_can_never_fit() -> None:
    with pytest.raises(LimitExceeded, match="never fit"), ImageBudget(4, Metrics()).admit(5):
        pass


def test_refusal_reports_the_budget_and_takes_nothing() -> None:
    """mutmut does not mutate ``admit`` (a decorated function): its details are pinned here."""
    metrics = Metrics()
    budget = ImageBudget(10, metrics)
    with budget.admit(7):
        with pytest.raises(Overloaded) as refused, budget.admit(4):
            pass
        assert refused.value.reason == "7 of 10 images in flight; 4 more do not fit"
        assert refused.value.extra == {"in_flight": 7, "capacity": 10}
        assert (budget.in_flight, metrics.inflight._value.get()) == (7, 7)
        with budget.admit(3):  # exactly full still fits
            assert (budget.in_flight, metrics.inflight._value.get()) == (10, 10)
    with pytest.raises(LimitExceeded) as too_big, budget.admit(11):
        pass
    assert too_big.value.reason == (
        "11 images can never fit the in-flight budget of 10; split the request"
    )
    assert (budget.in_flight, metrics.inflight._value.get()) == (0, 0)
