"""Which Triton profile for this machine: detect the GPU (NVML), look it up, or use a
calibration (runtime/calibrate.py).

The table is seeded with the background reports' measurements of ViT-B/32 (batch 1, FP16):
the best execution provider depends on the GPU, by a lot, in both directions.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from gateway.runtime import calibrate
from gateway.runtime.settings import Profile

log = logging.getLogger(__name__)


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


def choose(
    override: str,
    gpu: GpuInfo | None,
    *,
    model: str,
    record: Path,
    calibrate_now: bool = False,
    timer: calibrate.Timer | None = None,
) -> tuple[Profile, str]:
    """Operator override > recorded calibration > fresh calibration (opt-in) > the table."""
    if override != "auto":
        return override, "as configured"  # type: ignore[return-value]
    if gpu is None:
        return "cpu", "no GPU"
    if (previous := calibrate.recorded(record, gpu.name, model)) is not None:
        return previous.winner, f"calibrated on this GPU earlier ({record})"
    if calibrate_now and timer is not None:
        result = calibrate.calibrate(gpu.name, model, timer, record)
        return result.winner, f"calibrated now: {result.per_image_ms}"
    return from_table(gpu)
