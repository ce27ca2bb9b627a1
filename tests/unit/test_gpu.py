"""Profile choice: the background reports' table, the override order, and calibration."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.runtime import calibrate
from gateway.runtime import profiles as gpu
from gateway.runtime.plan import WorkerPlan, worker_plan
from gateway.runtime.settings import LaunchSettings, RepositorySettings


def card(name: str, cc: tuple[int, int] = (8, 6)) -> gpu.GpuInfo:
    return gpu.GpuInfo(name, cc, 16.0)


@pytest.mark.parametrize(
    ("name", "cc", "profile"),
    [
        ("NVIDIA A100-SXM4-80GB", (8, 0), "cuda"),
        ("NVIDIA GeForce RTX 4080", (8, 9), "tensorrt"),
        ("NVIDIA RTX A4000", (8, 6), "tensorrt"),
        ("NVIDIA H100 80GB HBM3", (9, 0), "tensorrt"),  # unmeasured: the documented default
        ("Tesla P100-PCIE-16GB", (6, 0), "cuda"),  # no tensor cores
    ],
)
def test_table(name: str, cc: tuple[int, int], profile: str) -> None:
    chosen, reason = gpu.from_table(card(name, cc))
    assert chosen == profile
    assert reason


def test_no_gpu_is_cpu(tmp_path: Path) -> None:
    assert gpu.from_table(None) == ("cpu", "no GPU")
    assert gpu.choose("auto", None, model="m", record=tmp_path / "c.json")[0] == "cpu"


def test_detect_answers_on_any_host() -> None:
    # None without a driver, a GpuInfo with one: either way no exception (host-independent)
    found = gpu.detect()
    assert found is None or (found.name and found.memory_gib > 0)


def fake_timer(cuda_max: float, trt_max: float) -> calibrate.Timer:
    calls: list[str] = []

    def timer(profile: gpu.Profile) -> dict[str, float]:
        calls.append(profile)
        return {"1": 5.0, "max": cuda_max if profile == "cuda" else trt_max}

    timer.calls = calls  # type: ignore[attr-defined]
    return timer


def test_override_wins_over_everything(tmp_path: Path) -> None:
    record = tmp_path / "calibration.json"
    timer = fake_timer(1.0, 2.0)
    chosen = gpu.choose("tensorrt", card("NVIDIA A100"), model="m", record=record,
                        calibrate_now=True, timer=timer)  # fmt: skip
    assert chosen == ("tensorrt", "as configured")
    assert timer.calls == []  # type: ignore[attr-defined]


@pytest.mark.parametrize(("cuda", "trt", "winner"), [(0.4, 0.9, "cuda"), (0.9, 0.4, "tensorrt")])
def test_calibration_measures_once_then_is_reused(
    tmp_path: Path, cuda: float, trt: float, winner: str
) -> None:
    record = tmp_path / "engines" / "calibration.json"
    a4000 = card("NVIDIA RTX A4000")
    timer = fake_timer(cuda, trt)
    first = gpu.choose("auto", a4000, model="m", record=record, calibrate_now=True, timer=timer)
    assert first[0] == winner
    assert timer.calls == ["cuda", "tensorrt"]  # type: ignore[attr-defined]
    again = gpu.choose("auto", a4000, model="m", record=record, calibrate_now=True, timer=timer)
    assert again[0] == winner and "earlier" in again[1]
    assert timer.calls == ["cuda", "tensorrt"]  # type: ignore[attr-defined]  # not re-measured
    # another model file or another GPU: the record does not apply
    assert calibrate.recorded(record, a4000.name, "other-model") is None
    assert calibrate.recorded(record, "NVIDIA A100", "m") is None


def test_without_calibration_the_table_decides(tmp_path: Path) -> None:
    chosen = gpu.choose("auto", card("NVIDIA A100"), model="m", record=tmp_path / "none.json")
    assert chosen[0] == "cuda"


@pytest.mark.parametrize(
    ("cpus", "workers", "threads", "plan"),
    [
        (2, 0, 0, (1, 2)),
        (16, 0, 0, (4, 4)),
        (64, 0, 0, (8, 8)),
        (16, 2, 0, (2, 8)),
        (8, 0, 3, (2, 3)),
    ],
)
def test_worker_plan(cpus: int, workers: int, threads: int, plan: tuple[int, int]) -> None:
    assert worker_plan(cpus, workers, threads) == WorkerPlan(*plan)


def test_one_profile_setting_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_TRITON_PROFILE", "cuda")
    monkeypatch.setenv("GATEWAY_CALIBRATE", "true")
    assert RepositorySettings().profile == "cuda"
    assert LaunchSettings().calibrate


def test_auto_is_resolved_before_rendering(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The launcher resolves `auto` and renders with a concrete profile; rendering `auto`
    is refused rather than guessed."""
    from gateway.backend.repository import render_config

    monkeypatch.setenv("GATEWAY_TRITON_PROFILE", "auto")
    chosen = RepositorySettings().model_copy(update={"profile": "tensorrt"})
    assert render_config(chosen, 224, 512).backend == "onnxruntime"
    with pytest.raises(ValueError, match="auto"):
        render_config(RepositorySettings(), 224, 512)


@pytest.mark.parametrize(("memory_gib", "threads"), [(None, 4), (64, 4), (4, 3), (2, 1), (1, 1)])
def test_a_memory_limit_caps_the_decode_threads(memory_gib: int | None, threads: int) -> None:
    """8 CPUs: 2 workers x 4 threads; half the limit for the gateway, where each worker's base
    and one 256 MiB decode per thread must fit."""
    memory = memory_gib << 30 if memory_gib else None
    assert worker_plan(8, memory_bytes=memory).decode_threads == threads


def test_the_container_limits_are_read_from_cgroup_files(tmp_path: Path) -> None:
    from gateway.runtime.plan import cgroup_cpu_quota, cgroup_memory_limit, plan_for

    (tmp_path / "cpu.max").write_text("250000 100000\n")  # 2.5 CPUs
    (tmp_path / "memory.max").write_text(str(3 << 30))
    assert cgroup_cpu_quota(tmp_path) == 2.5
    assert cgroup_memory_limit(tmp_path) == 3 << 30
    assert plan_for(0, 0, 256, tmp_path) == WorkerPlan(1, 2)
    (tmp_path / "cpu.max").write_text("max 100000\n")
    (tmp_path / "memory.max").write_text("max\n")
    assert cgroup_cpu_quota(tmp_path) is None and cgroup_memory_limit(tmp_path) is None
