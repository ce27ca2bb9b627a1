"""How many uvicorn workers and decode threads, from the CPUs and memory this process may use.

In a container the host's numbers are the wrong ones: a pod limited to 2 CPUs on a 64-core node
that starts 16 workers x 4 threads spends its quota on contention, and one limited to 4 GB that
lets every thread decode a 256 MiB image at once is killed. The usable CPUs are the smallest of
the affinity mask, the cgroup CPU quota (v2 ``cpu.max``, v1 ``cfs_quota_us``) and the host's
cores; the memory limit (v2 ``memory.max``, v1 ``limit_in_bytes``) caps how many decodes may run
at once.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


def cgroup_cpu_quota(root: Path = CGROUP) -> float | None:
    """CPUs the cgroup allows (``quota / period``), or None when unlimited or unknown."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]  # cgroup v2: "max 100000"
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:  # cgroup v1
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota_us <= 0 else quota_us / period_us
    except (OSError, ValueError):
        return None


def cgroup_memory_limit(root: Path = CGROUP) -> int | None:
    """Bytes the cgroup allows, or None when unlimited or unknown."""
    for path in (root / "memory.max", root / "memory" / "memory.limit_in_bytes"):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text == "max":
            return None
        try:
            value = int(text)
        except ValueError:
            continue
        return None if value >= 1 << 60 else value  # v1 reports "unlimited" as a huge number
    return None


def usable_cpus(root: Path = CGROUP) -> int:
    """Whole CPUs this process may use (at least 1): affinity, quota and host, the smallest."""
    count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    count = count or 1
    quota = cgroup_cpu_quota(root)
    if quota is not None:
        count = min(count, max(1, math.floor(quota)))
    return max(1, count)


@dataclass(frozen=True)
class WorkerPlan:
    workers: int
    decode_threads: int


#: What one worker holds besides its decodes (interpreter, app, pools, shm regions): measured
#: ~110 MB warm (bench/results/footprint), with room.
WORKER_BASE_BYTES = 192 << 20


def worker_plan(
    cpus: int,
    workers: int = 0,
    threads: int = 0,
    *,
    memory_bytes: int | None = None,
    decode_bytes: int = 256 << 20,
) -> WorkerPlan:
    """Workers and decode threads per worker for ``cpus`` CPUs, where not set (0).

    HTTP parsing, multipart and the gRPC client run on each worker's event loop and hold about
    one core at full load, while decoding releases the GIL and scales with threads. One worker
    per four CPUs (at most 8) with threads filling the rest keeps every CPU busy without
    oversubscribing: 16 CPUs -> 4 workers x 4 threads; 2 CPUs -> 1 x 2. With a memory limit,
    at most half of it goes to the gateway (Triton and the model need the rest): threads are
    cut until every worker's base plus one worst-case decode per thread fits.
    """
    workers = workers or max(1, min(8, cpus // 4))
    threads = threads or max(1, cpus // workers)
    if memory_bytes:
        share = memory_bytes // 2 // workers - WORKER_BASE_BYTES
        threads = max(1, min(threads, share // decode_bytes))
    return WorkerPlan(workers, threads)


@dataclass(frozen=True)
class ModelPlan:
    instances: int
    threads: int


#: Model instances per tower on the CPU profiles, where not set (bench/results/plans, 2 CPUs).
#: ``cpu-int8``: two single-thread instances beat one two-thread instance (+12-24 % img/s
#: with 4 clients; single-image p50 31 vs 28 ms): while one batch is in the single-threaded
#: stretches between the INT8 GEMMs (dynamic quantization, LayerNorm, softmax, the Python
#: backend's hand-off), the other computes. ``cpu`` (FP32): the GEMMs are nearly all of the
#: time and scale over threads, so one instance with every thread is as fast with 4 clients and
#: far better for one client (single image ~58 vs ~94 ms) and in memory (each instance holds
#: a copy of the model: ~600 MB for both FP32 towers). More than two was not measured.
#: The OpenVINO profiles (``cpu-bf16``, ``cpu-int8-openvino``): one instance with every thread.
#: Through the whole gateway (bench/results/plans/openvino, 2-CPU EPYC) it is 1.57-1.63x the
#: two single-thread instances at batch 32 x 4 (57.4 vs 36.5 img/s INT8, 34.5 vs 21.2 BF16) and
#: better for one client too (single image 31 vs 38 ms, 41 vs 63 ms): OpenVINO runs its own
#: stretches between the matrix products in parallel, so a second instance buys nothing but a
#: second copy of the model.
CPU_MODEL_INSTANCES: dict[str, int] = {"cpu": 1, "cpu-int8": 2, "cpu-bf16": 1,
                                       "cpu-int8-openvino": 1}  # fmt: skip


def model_plan(profile: str, cpus: int, instances: int = 0, threads: int = 0) -> ModelPlan:
    """Model instances and ONNX Runtime intra-op threads per instance on the CPU profiles,
    where not set (0).

    ORT's own default is one thread per physical core of the *host*, blind to the cgroup quota:
    a pod limited to 2 CPUs on a 64-core node would run 64 threads per instance. The plan shares
    the usable CPUs between the instances; they share those with the decode threads too, which
    is why ORT's idle threads do not spin-wait (``RepositorySettings.cpu_spinning``) and why
    inter-op parallelism stays off (one thread: the graphs run node after node).
    """
    instances = instances or max(1, min(CPU_MODEL_INSTANCES.get(profile, 1), cpus))
    return ModelPlan(instances, threads or max(1, cpus // instances))


def plan_for(workers: int, threads: int, decode_mib: int, root: Path = CGROUP) -> WorkerPlan:
    """The plan for this container: its CPU quota and memory limit, the settings' overrides."""
    return worker_plan(
        usable_cpus(root),
        workers,
        threads,
        memory_bytes=cgroup_memory_limit(root),
        decode_bytes=decode_mib << 20,
    )
