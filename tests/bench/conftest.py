"""tests/bench: the bench's checks in one place (bench/README.md): the harness's, the live
studies' own, and the smoke runs (test_bench_smoke.py, test_bench_reliability_smoke.py), which
start the real stack through ``python -m bench`` as a person does. Those are marked
``integration`` in their modules and, like tests/integration's, launch with the CPU profiles'
table plan: a first start's background timing of the core plans would run beside what they
measure."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def plans_not_measured(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.get_closest_marker("integration"):
        monkeypatch.setenv("GATEWAY_PLAN_MEASURE_S", "0")
