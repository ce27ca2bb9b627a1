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
