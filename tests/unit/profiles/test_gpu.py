"""GPU profile choice (profiles/gpu.py): the background reports' table, names matched exactly,
the GPU found through NVML, and the override order (calibration's measurements:
tests/unit/profiles/test_calibrate.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from clip_gateway.config.settings import LaunchSettings, RepositorySettings
from clip_gateway.profiles import calibrate, engines, gpu


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


def test_without_calibration_the_table_decides(tmp_path: Path) -> None:
    chosen = gpu.choose(
        "auto", card("NVIDIA A100-SXM4-80GB"), model="m", record=tmp_path / "none.json"
    )
    assert chosen[0] == "cuda"


def test_one_profile_setting_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_TRITON_PROFILE", "cuda")
    monkeypatch.setenv("GATEWAY_CALIBRATE", "true")
    assert RepositorySettings().profile == "cuda"
    assert LaunchSettings().calibrate
