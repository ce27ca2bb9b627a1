"""Calibration's timer against a real tritonserver (profiles/timing.py ``batch_mix``, the cpu
profile standing in for the GPU ones, which need the NGC image), started by the launcher's host
(launcher/host.py ``trial``): the gateway's batch mix from concurrent callers, in rounds, within
the budget it is given, and a stop honoured."""

from __future__ import annotations

import threading

import pytest

from clip_gateway.config.processes import Interrupted
from clip_gateway.config.settings import Settings
from clip_gateway.launcher.host import TritonHost
from clip_gateway.profiles import timing


def host(stop: threading.Event) -> tuple[TritonHost, Settings]:
    # batch sizes 1 and 2 keep the CPU run short; the code path is the GPU one's
    settings = Settings.from_env(
        repository={"profile": "cpu", "preferred_batch_sizes": (1, 2), "max_batch_size": 2}
    )
    return TritonHost(settings, print, stop), settings


def test_measure_runs_rounds_of_the_batch_mix_on_a_real_triton(exported) -> None:
    launched, settings = host(threading.Event())
    rounds = timing.batch_mix(launched, settings.repository, exported.directory, budget_s=300,
                              callers=2)  # fmt: skip
    assert len(rounds) == timing.MIX_ROUNDS
    assert all(r > 0 for r in rounds)
    print(f"\ncalibration rounds on the cpu profile: {[round(r, 1) for r in rounds]} img/s")


def test_a_stop_ends_a_calibration(exported) -> None:
    stop = threading.Event()
    stop.set()
    launched, settings = host(stop)
    with pytest.raises(Interrupted):
        timing.batch_mix(launched, settings.repository, exported.directory, budget_s=300,
                         callers=4)  # fmt: skip
