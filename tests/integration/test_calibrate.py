"""Calibration's timer against a real tritonserver (the cpu profile stands in for the GPU ones,
which need the NGC image): the gateway's batch mix from concurrent callers, in rounds, within
the budget it is given, and a stop honoured."""

from __future__ import annotations

import threading

import pytest

from clip_gateway.config.processes import Interrupted
from clip_gateway.config.settings import Settings
from clip_gateway.launcher import calibrate


def small(exported) -> Settings:
    # batch sizes 1 and 2 keep the CPU run short; the code path is the GPU one's
    return Settings.from_env(repository={"preferred_batch_sizes": (1, 2), "max_batch_size": 2})


def test_measure_runs_rounds_of_the_batch_mix_on_a_real_triton(exported) -> None:
    rounds = calibrate.measure("cpu", exported.directory, small(exported), threading.Event(),
                               budget_s=300, callers=2)  # fmt: skip
    assert len(rounds) == calibrate.ROUNDS
    assert all(r > 0 for r in rounds)
    print(f"\ncalibration rounds on the cpu profile: {[round(r, 1) for r in rounds]} img/s")


def test_a_stop_ends_a_calibration(exported) -> None:
    stop = threading.Event()
    stop.set()
    with pytest.raises(Interrupted):
        calibrate.measure("cpu", exported.directory, small(exported), stop, budget_s=300,
                          callers=4)  # fmt: skip
