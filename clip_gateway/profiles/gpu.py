"""Which GPU profile for this GPU: detect it (NVML), look it up, or use a calibration
(profiles/calibrate.py).

The table is seeded with the background reports' measurements of ViT-B/32 (batch 1, FP16):
the best execution provider depends on the GPU, by a lot, in both directions.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

from clip_gateway.config.settings import Profile
from clip_gateway.profiles import calibrate
from clip_gateway.profiles.engines import same_gpu

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuInfo:
    name: str
    compute_capability: tuple[int, int]
    #: None when NVML refuses the query: on a MIG-partitioned GPU it answers unprivileged
    #: callers NVML_ERROR_NO_PERMISSION. Only logged; nothing is decided on it.
    memory_gib: float | None


@dataclass(frozen=True)
class Measured:
    """A row of the profile table: what was measured on which GPUs, and what that chooses."""

    #: NVML's names of the cards the measurement stands for, matched exactly (substrings are
    #: not safe: "A100" is in "NVIDIA RTX A1000", "4080" in "RTX 4080 SUPER").
    names: frozenset[str]
    profile: Profile
    evidence: str


#: Background reports (`../shared/seeds/`): GPU latency of the two GPU profiles.
TABLE: tuple[Measured, ...] = (
    Measured(
        frozenset(
            {
                "NVIDIA A100-SXM4-40GB",
                "NVIDIA A100-SXM4-80GB",
                "NVIDIA A100-PCIE-40GB",
                "NVIDIA A100 80GB PCIe",
            }
        ),
        "cuda",
        "A100: ONNX CUDA EP 4.4 ms vs TensorRT EP 29.1 ms",
    ),
    Measured(
        frozenset({"NVIDIA GeForce RTX 4080"}),
        "tensorrt",
        "RTX 4080: TensorRT EP 2.0 ms vs CUDA EP 5.7 ms",
    ),
    Measured(
        frozenset({"NVIDIA RTX A4000"}),
        "tensorrt",
        "RTX A4000: TensorRT EP 4.7 ms vs CUDA EP 31.1 ms",
    ),
)
#: Unmeasured GPUs: TensorRT won on 2 of the 3 measured GPUs, and needs tensor cores (7.0+) for
#: FP16; older GPUs get the CUDA EP. `calibrate` replaces this guess with a measurement, and a
#: TensorRT profile that does not load falls back to the CUDA EP (profiles/choice.py FALLBACK).
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
        return GpuInfo(
            name.decode() if isinstance(name, bytes) else str(name), (major, minor), _memory(handle)
        )
    finally:
        pynvml.nvmlShutdown()


def _memory(handle: object) -> float | None:
    """The GPU's memory in GiB, or None when NVML refuses to say (MIG: no permission)."""
    import pynvml

    try:
        return float(pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**30)
    except pynvml.NVMLError as exc:
        log.info("GPU memory not readable here (%s; MIG partitions refuse it)", exc)
        return None


def from_table(gpu: GpuInfo | None) -> tuple[Profile, str]:
    """(profile, reason) for a GPU by the table, without measuring anything."""
    if gpu is None:
        return "cpu", "no GPU"
    for row in TABLE:
        if any(same_gpu(gpu.name, name) for name in row.names):
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
    deadline: float = math.inf,
) -> tuple[Profile, str]:
    """Operator override > recorded calibration > fresh calibration (opt-in) > the table.
    (``auto`` without a GPU races the CPU profiles instead: profiles/choice.py.)

    ``model`` is the model's identity (clip_gateway.model.spec.model_identity): a calibration holds
    only for the GPU model and the weights it measured. A calibration that measures nothing falls
    back to the table, saying why.
    """
    if override != "auto":
        return override, "as configured"  # type: ignore[return-value]
    if gpu is None:
        return from_table(gpu)
    if (previous := calibrate.recorded(record, gpu.name, model)) is not None:
        return previous.winner, f"calibrated on this GPU earlier: {previous.reason}"
    table_choice, table_reason = from_table(gpu)
    if calibrate_now and timer is not None:
        try:
            result = calibrate.calibrate(
                gpu.name, model, timer, record, default=table_choice, deadline=deadline
            )
        except calibrate.CalibrationFailed as exc:
            log.error("calibration measured no profile (%s); using the table", exc)
            return table_choice, f"{table_reason}; calibration failed: {exc}"
        return result.winner, f"calibrated now: {result.reason}"
    return table_choice, table_reason
