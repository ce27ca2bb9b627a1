"""Which Triton profile for this machine: detect the GPU (NVML), look it up, or calibrate.

The table is seeded with the background reports' measurements of ViT-B/32 (batch 1, FP16):
the best execution provider depends on the GPU, by a lot, in both directions.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

log = logging.getLogger(__name__)

Profile = Literal["cpu", "cuda", "tensorrt"]


@dataclass(frozen=True)
class GpuInfo:
    name: str
    compute_capability: tuple[int, int]
    memory_gib: float


@dataclass(frozen=True)
class Measured:
    """A row of the profile table: what was measured where, and what that chooses."""

    name_contains: str
    profile: Profile
    evidence: str


#: Background reports (`../shared/seeds/`): GPU latency of the two GPU profiles.
TABLE: tuple[Measured, ...] = (
    Measured("A100", "cuda", "A100: ONNX CUDA EP 4.4 ms vs TensorRT EP 29.1 ms"),
    Measured("4080", "tensorrt", "RTX 4080: TensorRT EP 2.0 ms vs CUDA EP 5.7 ms"),
    Measured("A4000", "tensorrt", "RTX A4000: TensorRT EP 4.7 ms vs CUDA EP 31.1 ms"),
)
#: Unmeasured GPUs: TensorRT won on 2 of the 3 measured GPUs, and needs tensor cores (7.0+) for
#: FP16; older GPUs get the CUDA EP. `calibrate` replaces this guess with a measurement.
DEFAULT_REASON = "unmeasured GPU: TensorRT EP (won on 2 of 3 measured GPUs); run calibrate"


def detect() -> GpuInfo | None:
    """The first GPU NVML sees, or None (no driver, no GPU, no nvidia-ml-py)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        log.info("no GPU found (%s)", exc)
        return None
    try:
        if pynvml.nvmlDeviceGetCount() == 0:
            return None
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(handle)
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**30
        return GpuInfo(
            name.decode() if isinstance(name, bytes) else str(name), (major, minor), memory
        )
    finally:
        pynvml.nvmlShutdown()


def from_table(gpu: GpuInfo | None) -> tuple[Profile, str]:
    """(profile, reason) for a GPU by the table, without measuring anything."""
    if gpu is None:
        return "cpu", "no GPU"
    for row in TABLE:
        if row.name_contains.lower() in gpu.name.lower():
            return row.profile, row.evidence
    if gpu.compute_capability < (7, 0):
        return "cuda", "no tensor cores (compute capability < 7.0): CUDA EP"
    return "tensorrt", DEFAULT_REASON


@dataclass(frozen=True)
class Calibration:
    gpu: str
    model: str
    winner: Profile
    #: milliseconds per image at each measured batch size, per profile
    per_image_ms: dict[str, dict[str, float]]


#: Times one profile: milliseconds per image at batch 1 and at max batch: {"1": 2.1, "max": 0.3}.
Timer = Callable[[Profile], dict[str, float]]


def calibrate(gpu: GpuInfo, model: str, timer: Timer, record: Path) -> Calibration:
    """Measure both GPU profiles on this GPU, keep the faster at max batch (ties: batch 1)."""
    timings = {profile: timer(profile) for profile in ("cuda", "tensorrt")}

    def key(profile: str) -> tuple[float, float]:
        return timings[profile].get("max", float("inf")), timings[profile].get("1", float("inf"))

    winner: Profile = "cuda" if key("cuda") <= key("tensorrt") else "tensorrt"
    result = Calibration(gpu.name, model, winner, timings)
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(asdict(result), indent=1))
    return result


def recorded(record: Path, gpu: GpuInfo, model: str) -> Calibration | None:
    """A previous calibration for this GPU and model file, if any."""
    try:
        data = json.loads(record.read_text())
    except (OSError, ValueError):
        return None
    if data.get("gpu") != gpu.name or data.get("model") != model:
        return None
    return Calibration(**data)


def choose(
    override: str,
    gpu: GpuInfo | None,
    *,
    model: str,
    record: Path,
    calibrate_now: bool = False,
    timer: Timer | None = None,
) -> tuple[Profile, str]:
    """Operator override > recorded calibration > fresh calibration (opt-in) > the table."""
    if override != "auto":
        return override, "set by GATEWAY_TRITON_PROFILE"  # type: ignore[return-value]
    if gpu is None:
        return "cpu", "no GPU"
    if (previous := recorded(record, gpu, model)) is not None:
        return previous.winner, f"calibrated on this GPU earlier ({record})"
    if calibrate_now and timer is not None:
        result = calibrate(gpu, model, timer, record)
        return result.winner, f"calibrated now: {result.per_image_ms}"
    return from_table(gpu)
