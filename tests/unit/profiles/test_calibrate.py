"""GPU calibration (profiles/calibrate.py): both GPU profiles measured once per GPU model and
model identity within the start-up budget, the winner only by more than the margin and its own
rounds' spread, a profile that fails losing with its reason; and the batch mix it sends
(profiles/timing.py ``workload``). Through a real Triton: tests/integration/test_calibrate.py."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from clip_gateway.profiles import calibrate, timing
from tests.unit.profiles.test_gpu import choose_now, fake_timer


@pytest.mark.parametrize(
    ("cuda", "trt", "winner"),
    [([900.0, 910, 905], [400.0, 401, 399], "cuda"), ([400.0, 401, 399], [900.0, 910, 905],
      "tensorrt")],
)  # fmt: skip
def test_calibration_measures_once_then_is_reused(
    tmp_path: Path, cuda: list[float], trt: list[float], winner: str
) -> None:
    record = tmp_path / "engines" / "calibration.json"
    timer = fake_timer(cuda, trt)
    first = choose_now(timer, record)
    assert first[0] == winner and "calibrated now" in first[1]
    assert [p for p, _ in timer.calls] == ["cuda", "tensorrt"]  # type: ignore[attr-defined]
    again = choose_now(timer, record)
    assert again[0] == winner and "earlier" in again[1]
    assert len(timer.calls) == 2  # type: ignore[attr-defined]  # not re-measured
    # another model (weights, export code) or another GPU model: the record does not apply
    assert calibrate.recorded(record, "NVIDIA RTX A4000", "id-2") is None
    assert calibrate.recorded(record, "NVIDIA RTX A4500", "id-1") is None
    assert calibrate.recorded(record, "RTX A4000", "id-1") is not None  # same card, old driver


def test_a_difference_within_the_margin_keeps_the_table_choice(tmp_path: Path) -> None:
    # 5 % apart: less than MARGIN, so not worth overriding the table's measured evidence
    timer = fake_timer([1000.0, 1000, 1000], [950.0, 950, 950])
    chosen, reason = choose_now(timer, tmp_path / "c.json")
    assert chosen == "tensorrt" and "keeping tensorrt" in reason


def test_noisy_rounds_need_a_bigger_difference(tmp_path: Path) -> None:
    # 20 % apart on medians, but cuda's own rounds spread 30 %: not a result
    timer = fake_timer([1200.0, 900, 1300], [1000.0, 1000, 1000])
    assert choose_now(timer, tmp_path / "c.json")[0] == "tensorrt"
    steady = fake_timer([1200.0, 1200, 1210], [1000.0, 1000, 1000])
    assert choose_now(steady, tmp_path / "d.json")[0] == "cuda"


def test_a_profile_that_fails_loses_with_its_reason(tmp_path: Path) -> None:
    record = tmp_path / "c.json"
    timer = fake_timer([500.0, 500, 500], RuntimeError("tritonserver model READY: exited"))
    chosen, reason = choose_now(timer, record)
    assert chosen == "cuda"
    assert "tensorrt failed (tritonserver model READY: exited)" in reason
    saved = calibrate.recorded(record, "NVIDIA RTX A4000", "id-1")
    assert saved is not None and "tensorrt" in saved.failures


def test_when_nothing_can_be_measured_the_table_decides(tmp_path: Path) -> None:
    record = tmp_path / "c.json"
    timer = fake_timer(RuntimeError("no CUDA"), RuntimeError("no TensorRT"))
    chosen, reason = choose_now(timer, record)
    assert chosen == "tensorrt" and "calibration failed" in reason and "no CUDA" in reason
    assert not record.exists()  # nothing learnt, nothing kept: the next start measures again


def test_calibration_measures_within_the_start_up_budget(tmp_path: Path) -> None:
    timer = fake_timer([500.0], [600.0])
    deadline = time.monotonic() + 100
    choose_now(timer, tmp_path / "c.json", deadline=deadline)
    budgets = [budget for _, budget in timer.calls]  # type: ignore[attr-defined]
    assert all(0 < b <= 100 for b in budgets)
    spent = fake_timer([500.0], [600.0])
    chosen, reason = choose_now(spent, tmp_path / "d.json", deadline=time.monotonic() - 1)
    assert spent.calls == []  # type: ignore[attr-defined]
    assert "no start-up budget left" in reason and chosen == "tensorrt"


def test_calibration_workload_mixes_every_batch_size() -> None:
    rounds = timing.workload((1, 4, 8, 16, 32), callers=4)
    assert len(rounds) == 4
    assert all(set(r) == {1, 4, 8, 16, 32} for r in rounds)
    assert len({r[0] for r in rounds}) == 4  # callers start at different sizes
