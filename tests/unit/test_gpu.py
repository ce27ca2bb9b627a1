"""Profile choice: the background reports' table, the override order, and calibration."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from clip_gateway.config.plan import WorkerPlan, worker_plan
from clip_gateway.config.settings import LaunchSettings, RepositorySettings
from clip_gateway.launcher import calibrate, engines
from clip_gateway.launcher import profiles as gpu


def card(name: str, cc: tuple[int, int] = (8, 6)) -> gpu.GpuInfo:
    return gpu.GpuInfo(name, cc, 16.0)


@pytest.mark.parametrize(
    ("name", "cc", "profile"),
    [
        ("NVIDIA A100-SXM4-80GB", (8, 0), "cuda"),
        ("NVIDIA A100 80GB PCIe", (8, 0), "cuda"),
        ("A100-SXM4-40GB", (8, 0), "cuda"),  # older drivers leave out "NVIDIA "
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


@pytest.mark.parametrize(
    ("name", "not_like"),
    [("NVIDIA RTX A1000", "A100"), ("NVIDIA RTX A1000 6GB Laptop GPU", "A100"),
     ("NVIDIA GeForce RTX 4080 SUPER", "RTX 4080"), ("NVIDIA RTX A4000 Laptop GPU", "A4000")],
)  # fmt: skip
def test_names_match_exactly_not_as_substrings(name: str, not_like: str) -> None:
    """A measurement holds for the card it was made on: "A100" is inside "RTX A1000"."""
    chosen, reason = gpu.from_table(card(name, (8, 6)))
    assert (chosen, reason) == ("tensorrt", gpu.DEFAULT_REASON)
    assert not any(engines.same_gpu(name, known) for row in gpu.TABLE for known in row.names)


def test_no_gpu_is_cpu(tmp_path: Path) -> None:
    assert gpu.from_table(None) == ("cpu", "no GPU")
    assert gpu.choose("auto", None, model="m", record=tmp_path / "c.json")[0] == "cpu"


def test_detect_answers_on_any_host() -> None:
    # None without a driver, a GpuInfo with one: either way no exception (host-independent)
    found = gpu.detect()
    assert found is None or (found.name and (found.memory_gib is None or found.memory_gib > 0))


def test_a_mig_gpu_that_refuses_the_memory_query_is_still_detected(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On MIG-partitioned GPUs NVML answers an unprivileged caller's memory query with
    NO_PERMISSION; the memory is only logged, so the GPU is still found (it used to crash the
    launcher)."""
    import pynvml

    def refused(handle: object) -> object:
        raise pynvml.NVMLError_NoPermission()

    for name, value in {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": lambda: 1,
        "nvmlDeviceGetHandleByIndex": lambda index: object(),
        "nvmlDeviceGetName": lambda handle: "NVIDIA A100-SXM4-40GB",
        "nvmlDeviceGetCudaComputeCapability": lambda handle: (8, 0),
        "nvmlDeviceGetMemoryInfo": refused,
    }.items():
        monkeypatch.setattr(pynvml, name, value)
    found = gpu.detect()
    assert found == gpu.GpuInfo("NVIDIA A100-SXM4-40GB", (8, 0), None)
    assert gpu.from_table(found)[0] == "cuda"


def fake_timer(cuda: list[float] | Exception, trt: list[float] | Exception) -> calibrate.Timer:
    """Images per second per round for each profile, or the error measuring it raises."""
    calls: list[tuple[str, float]] = []

    def timer(profile: gpu.Profile, budget: float) -> list[float]:
        calls.append((profile, budget))
        result = cuda if profile == "cuda" else trt
        if isinstance(result, Exception):
            raise result
        return result

    timer.calls = calls  # type: ignore[attr-defined]
    return timer


def choose_now(timer: calibrate.Timer, record: Path, name: str = "NVIDIA RTX A4000",
               deadline: float = math.inf) -> tuple[str, str]:  # fmt: skip
    return gpu.choose("auto", card(name), model="id-1", record=record, calibrate_now=True,
                      timer=timer, deadline=deadline)  # fmt: skip


def test_override_wins_over_everything(tmp_path: Path) -> None:
    timer = fake_timer([100.0], [200.0])
    chosen = gpu.choose("tensorrt", card("NVIDIA A100-SXM4-80GB"), model="m",
                        record=tmp_path / "c.json", calibrate_now=True, timer=timer)  # fmt: skip
    assert chosen == ("tensorrt", "as configured")
    assert timer.calls == []  # type: ignore[attr-defined]


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
    rounds = calibrate.workload((1, 4, 8, 16, 32), callers=4)
    assert len(rounds) == 4
    assert all(set(r) == {1, 4, 8, 16, 32} for r in rounds)
    assert len({r[0] for r in rounds}) == 4  # callers start at different sizes


def test_without_calibration_the_table_decides(tmp_path: Path) -> None:
    chosen = gpu.choose(
        "auto", card("NVIDIA A100-SXM4-80GB"), model="m", record=tmp_path / "none.json"
    )
    assert chosen[0] == "cuda"


@pytest.mark.parametrize(
    ("cpus", "workers", "threads", "plan"),
    [
        (2, 0, 0, (2, 1)),
        (16, 0, 0, (16, 1)),
        (64, 0, 0, (32, 1)),
        (16, 2, 0, (2, 8)),
        (8, 0, 3, (2, 3)),
    ],
)
def test_worker_plan(cpus: int, workers: int, threads: int, plan: tuple[int, int]) -> None:
    """Thin workers on the gateway's cores (tests/unit/test_plan.py has the split and why)."""
    assert worker_plan(cpus, workers, threads) == WorkerPlan(*plan)


def test_one_profile_setting_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_TRITON_PROFILE", "cuda")
    monkeypatch.setenv("GATEWAY_CALIBRATE", "true")
    assert RepositorySettings().profile == "cuda"
    assert LaunchSettings().calibrate


def test_auto_is_resolved_before_rendering(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The launcher resolves `auto` and renders with a concrete profile; rendering `auto`
    is refused rather than guessed."""
    from clip_gateway.launcher.repository import render_config

    monkeypatch.setenv("GATEWAY_TRITON_PROFILE", "auto")
    chosen = RepositorySettings().model_copy(update={"profile": "tensorrt"})
    assert render_config(chosen, 224, 512).backend == "onnxruntime"
    with pytest.raises(ValueError, match="auto"):
        render_config(RepositorySettings(), 224, 512)


def test_the_container_limits_are_read_from_cgroup_files(tmp_path: Path) -> None:
    from clip_gateway.config.plan import cgroup_cpu_quota, cgroup_memory_limit, plan_for

    (tmp_path / "cpu.max").write_text("250000 100000\n")  # 2.5 CPUs
    (tmp_path / "memory.max").write_text(str(3 << 30))
    assert cgroup_cpu_quota(tmp_path) == 2.5
    assert cgroup_memory_limit(tmp_path) == 3 << 30
    assert plan_for(0, 0, 256, tmp_path) == WorkerPlan(2, 1)
    (tmp_path / "cpu.max").write_text("max 100000\n")
    (tmp_path / "memory.max").write_text("max\n")
    assert cgroup_cpu_quota(tmp_path) is None and cgroup_memory_limit(tmp_path) is None


@pytest.mark.parametrize(
    ("profile", "cpus", "instances", "threads", "expected"),
    [("cpu-int8", 2, 0, 0, (2, 1)), ("cpu-int8", 1, 0, 0, (1, 1)),
     ("cpu-int8", 16, 0, 0, (2, 8)), ("cpu-int8", 3, 0, 0, (2, 1)),
     ("cpu", 2, 0, 0, (1, 2)), ("cpu", 16, 0, 0, (1, 16)),
     ("cpu", 16, 4, 0, (4, 4)), ("cpu-int8", 2, 1, 0, (1, 2)), ("cpu", 64, 1, 6, (1, 6))],
)  # fmt: skip
def test_the_model_gets_the_usable_cpus_between_its_instances(
    profile: str, cpus: int, instances: int, threads: int, expected: tuple[int, int]
) -> None:
    """ORT's own default counts the host's cores; the plan counts what the cgroup allows."""
    from clip_gateway.config.plan import ModelPlan, model_plan

    assert model_plan(profile, cpus, instances, threads) == ModelPlan(*expected)


def test_a_cpu_quota_sets_the_model_plan(tmp_path: Path) -> None:
    from clip_gateway.config.plan import ModelPlan, model_plan, usable_cpus

    (tmp_path / "cpu.max").write_text("150000 100000\n")  # 1.5 CPUs: one whole CPU
    assert model_plan("cpu-int8", usable_cpus(tmp_path)) == ModelPlan(1, 1)
    assert model_plan("cpu", usable_cpus(tmp_path)) == ModelPlan(1, 1)
