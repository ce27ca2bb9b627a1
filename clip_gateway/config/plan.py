"""How many uvicorn workers and decode threads, from the CPUs and memory this process may use.

In a container the host's numbers are the wrong ones: a pod limited to 2 CPUs on a 64-core node
that starts 16 workers x 4 threads spends its quota on contention, and one limited to 4 GB that
lets every thread decode a 256 MiB image at once is killed. The usable CPUs are the smallest of
the affinity mask, the cgroup CPU quota (v2 ``cpu.max``, v1 ``cfs_quota_us``) and the host's
cores; the memory limit (v2 ``memory.max``, v1 ``limit_in_bytes``) caps how many decodes may run
at once. Beside Triton they are split with the model's side by each side's CPU per image
(``CoreFigures``); the model's side of a CPU profile (its instances x threads, the candidates and
the rule that picks one) is the profiles' (clip_gateway/profiles/plans.py).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clip_gateway.config.settings import ServerSettings

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
class CoreFigures:
    """What the worker plan is fed: CPU per image measured on each side of the hop, and the
    decode threads per worker that measured best per core."""

    #: The gateway's CPU per image (all its processes: HTTP, parsing, decode, resize, gRPC) at
    #: batch 32, microseconds.
    gateway_us: float
    #: The model side's CPU per image, microseconds: on a GPU host Triton's (its process and the
    #: backend stubs); on a CPU profile the model's own (all usable CPUs over its images/s).
    model_us: float
    #: Decode threads per worker that gave the most images/s per core.
    decode_threads: int
    #: Where the figures come from (a measurement here, or the committed run they default to).
    source: str

    def as_dict(self) -> dict[str, Any]:
        return {"gateway_us_per_image": round(self.gateway_us), "model_us_per_image":
                round(self.model_us), "decode_threads": self.decode_threads,
                "source": self.source}  # fmt: skip


#: The GPU host's figures until one is measured there: the second H200 host run
#: (bench/results/host, 16 Xeon cores, ViT-B/32 FP16 uploads at batch 32 x 16 clients through 8
#: single-thread workers, 8,766 images/s): the gateway's CPU per image 539 us, Triton's process
#: tree's (the server and the CUDA EP's Python-backend stubs) 220 us. The first run
#: (bench/results/host/h200-first-2026-11) gave 960 us for the gateway with shared memory off in
#: some workers and at most 692 us for Triton, bounded from the cores it had, not measured. Per
#: core, 8 single-thread workers reached 0.65 of one worker's images/s there, 2 workers x 4
#: threads (the fixed rule's shape on 9 cores) 0.39: a decode thread added to a worker is worth
#: less than a worker.
GPU_FIGURES = CoreFigures(539.0, 220.0, 1, "bench/results/host (H200 host, 16 Xeon cores)")
#: A CPU profile's figures until its plan is measured here: the gateway's the first H200 run's
#: (960 us, the dearer of the two: the gateway then keeps a core more on a large CPU host), the
#: model's from the fastest CPU profile measured through the gateway (bench/results/plans/openvino:
#: cpu-int8-openvino, 57.4 images/s at batch 32 x 4 on 2 CPUs, 2 / 57.4 s = 34,843 us per image).
CPU_FIGURES = CoreFigures(960.0, 34_843.0, 1, "bench/results/plans (2-CPU EPYC, cpu-int8-openvino)")


@dataclass(frozen=True)
class WorkerPlan:
    workers: int
    decode_threads: int
    #: cores left to Triton by the split (0: not split, the gateway's cores were given)
    triton_cores: int = 0


#: What one worker holds besides its decodes (interpreter, app, pools, shm regions): measured
#: ~110 MB warm (bench/results/footprint), with room.
WORKER_BASE_BYTES = 192 << 20
#: At most this many workers: each holds its own pools, shared-memory regions and gRPC channel,
#: and more than 8 were never measured.
MAX_WORKERS = 32


def core_split(cpus: int, figures: CoreFigures) -> tuple[int, int]:
    """(gateway cores, Triton's cores) of ``cpus``, in proportion to each side's CPU per image:
    at full load each side needs ``images/s x its CPU per image`` cores. The gateway's share is
    rounded up (it feeds everything after it); Triton keeps at least one core when there are
    two. On a CPU profile the model's share is nearly everything, and its instances' threads
    span every usable CPU anyway (the gateway's decodes take their share when they run)."""
    share = figures.gateway_us / (figures.gateway_us + figures.model_us)
    gateway = max(1, min(cpus - 1 if cpus > 1 else 1, math.ceil(cpus * share - 1e-9)))
    return gateway, cpus - gateway


def worker_plan(
    cpus: int,
    workers: int = 0,
    threads: int = 0,
    *,
    memory_bytes: int | None = None,
    decode_bytes: int = 256 << 20,
    figures: CoreFigures = GPU_FIGURES,
) -> WorkerPlan:
    """Workers and decode threads per worker on the gateway's ``cpus``, where not set (0).

    Thin workers: ``figures.decode_threads`` (1 as measured) threads each, one worker per that
    many cores (at most ``MAX_WORKERS``). Each worker's event loop (HTTP, multipart, pricing,
    gRPC) holds the GIL for a good part of an image's CPU, so per core a second worker outruns
    a second decode thread (the H200 host: 8 x 1 on 9 cores 7,905 images/s, 2 x 4 5,383). A
    worker count set without threads shares the cores between them; threads set without
    workers get as many workers as fit. With a memory limit, at most half of it goes to the
    gateway (Triton and the model need the rest): workers, then threads, are cut until every
    worker's base plus one worst-case decode per thread fits.
    """
    if workers and not threads:
        threads = max(1, cpus // workers)
    threads = threads or max(1, min(figures.decode_threads, cpus))
    workers = workers or max(1, min(MAX_WORKERS, cpus // threads))
    if memory_bytes:
        share = memory_bytes // 2
        fits = share // (WORKER_BASE_BYTES + threads * decode_bytes)
        workers = max(1, min(workers, fits))
        per_worker = share // workers - WORKER_BASE_BYTES
        threads = max(1, min(threads, per_worker // decode_bytes))
    return WorkerPlan(workers, threads)


def plan_for(
    workers: int,
    threads: int,
    decode_mib: int,
    root: Path = CGROUP,
    figures: CoreFigures | None = None,
) -> WorkerPlan:
    """The plan for this container: its CPU quota and memory limit, the settings' overrides.
    With ``figures`` (the launcher: Triton runs beside the gateway) the usable CPUs are split
    first (``core_split``) and the workers planned on the gateway's share; without, every
    usable CPU is the gateway's."""
    cpus = usable_cpus(root)
    gateway, triton = core_split(cpus, figures) if figures is not None else (cpus, 0)
    planned = worker_plan(gateway, workers, threads, memory_bytes=cgroup_memory_limit(root),
                          decode_bytes=decode_mib << 20,
                          figures=figures or GPU_FIGURES)  # fmt: skip
    return WorkerPlan(planned.workers, planned.decode_threads, triton)


def planned_workers(server: ServerSettings) -> int:
    """GATEWAY_WORKERS where it was set (its default, 1, is for the HTTP process run by hand),
    else 0: the launcher plans them."""
    return server.workers if "workers" in server.model_fields_set else 0


def gateway_plan(
    server: ServerSettings, figures: CoreFigures, *, model_spans_cpus: bool
) -> tuple[WorkerPlan, str]:
    """The launcher's plan for the gateway beside Triton, and how it was made (the ready line);
    ``model_spans_cpus``: a CPU profile, whose threads span every usable CPU."""
    workers = planned_workers(server)
    planned = plan_for(workers, server.decode_threads, server.max_decode_mib, figures=figures)
    if workers or server.decode_threads:
        return planned, "as configured"
    cpus = usable_cpus()
    shared = f"; the model's threads span all {cpus}" if model_spans_cpus else ""
    gateway = cpus - planned.triton_cores
    return planned, (f"planned: {figures.gateway_us:.0f} us of gateway CPU per image against "
                     f"{figures.model_us:.0f} us of the model's ({figures.source}), "
                     f"{gateway} of {cpus} cores the gateway's{shared}")  # fmt: skip
