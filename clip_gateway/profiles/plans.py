"""A CPU profile's core plan: model instances per tower x ONNX Runtime (or OpenVINO) threads per
instance. The table's plan until one is measured here (``model_plan``), the candidates measured
(``plan_candidates``) and the rule that picks one of them (``choose_model_plan``); measuring and
keeping the choice is the planner's (profiles/planner.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelPlan:
    instances: int
    threads: int

    @property
    def name(self) -> str:
        return f"{self.instances}x{self.threads}"

    @classmethod
    def parse(cls, name: str) -> ModelPlan:
        instances, threads = name.split("x")
        return cls(int(instances), int(threads))


#: Model instances per tower on the CPU profiles before their plan is measured here (the
#: provisional plan, and the one ``auto`` times each profile with: bench/results/plans, 2 CPUs).
#: ``cpu-int8``: two single-thread instances beat one two-thread instance on the EPYC (+12-24 %
#: img/s with 4 clients; single-image p50 31 vs 28 ms). ``cpu`` (FP32) and the OpenVINO
#: profiles (``cpu-bf16``, ``cpu-int8-openvino``): one instance with every thread (through the
#: whole gateway on the EPYC, bench/results/plans/openvino, 1.57-1.63x two single-thread
#: instances at batch 32 x 4, and better for one client). Which plan serves on a given machine
#: is measured there (``plan_candidates``, ``choose_model_plan``, profiles/planner.py).
CPU_MODEL_INSTANCES: dict[str, int] = {"cpu": 1, "cpu-int8": 2, "cpu-bf16": 1,
                                       "cpu-int8-openvino": 1}  # fmt: skip
#: Most model instances a candidate plan has: each holds a copy of the model (~240 MB for both
#: INT8 towers, ~600 MB FP32), and more than two were never faster anywhere measured.
MAX_INSTANCES = 4
#: A plan within this fraction of the best batch throughput counts as tied on throughput, and
#: the single-image latency decides (``choose_model_plan``); more where the plans' own rounds
#: spread more, up to ``MAX_TOLERANCE``.
THROUGHPUT_TOLERANCE = 0.05
MAX_TOLERANCE = 0.20


def model_plan(profile: str, cpus: int, instances: int = 0, threads: int = 0) -> ModelPlan:
    """Model instances and ONNX Runtime intra-op threads per instance on the CPU profiles,
    where not set (0): the provisional plan (``CPU_MODEL_INSTANCES``).

    ORT's own default is one thread per physical core of the *host*, blind to the cgroup quota:
    a pod limited to 2 CPUs on a 64-core node would run 64 threads per instance. The plan shares
    the usable CPUs between the instances; they share those with the decode threads too, which
    is why ORT's idle threads do not spin-wait (``RepositorySettings.cpu_spinning``) and why
    inter-op parallelism stays off (one thread: the graphs run node after node).
    """
    instances = instances or max(1, min(CPU_MODEL_INSTANCES.get(profile, 1), cpus))
    return ModelPlan(instances, threads or max(1, cpus // instances))


def plan_candidates(cpus: int) -> list[ModelPlan]:
    """The plans measured on ``cpus`` CPUs: 1 x N, 2 x N/2, 4 x N/4 (at most ``MAX_INSTANCES``
    instances, at least one thread each)."""
    found, instances = [], 1
    while instances <= min(cpus, MAX_INSTANCES):
        found.append(ModelPlan(instances, cpus // instances))
        instances *= 2
    return found


@dataclass(frozen=True)
class PlanTiming:
    """One candidate plan, measured: batch-32 images/s from 4 callers, one image's p50, and
    how far its counted rounds spread ((max - min) / median)."""

    images_per_s: float
    single_p50_ms: float
    spread: float = 0.0


def choose_model_plan(timings: Mapping[ModelPlan, PlanTiming]) -> tuple[ModelPlan, str]:
    """The plan with the lowest single-image p50 among those within the tolerance of the best
    batch-32 throughput (fewer instances on a tie: less memory); and why. The tolerance is
    ``THROUGHPUT_TOLERANCE``, or the widest spread of any plan's rounds where that is more (at
    most ``MAX_TOLERANCE``).

    Batches are what a library import or a backfill sends, one image at a time what a person
    waiting on a search or an upload sees. A plan that loses more than 5 % of the batch
    throughput is never chosen for its latency; within 5 % the two throughputs are as good as
    tied (the rounds of one plan spread by about that on a quiet 2-CPU machine), and the
    latency, which differs between plans by up to 2x (one instance's single image runs on every
    thread, one of two instances' on half of them), decides. On a busy machine the rounds spread
    more, and a difference within that spread is the load's, not the plan's: measured beside
    other jobs here, cpu-int8's 1 x 2 gave 11.7 images/s (p50 33 ms) and 2 x 1 12.4 (68 ms)."""
    best = max(t.images_per_s for t in timings.values())
    tolerance = min(
        MAX_TOLERANCE, max([THROUGHPUT_TOLERANCE, *(t.spread for t in timings.values())])
    )
    floor = best * (1 - tolerance)
    tied = [p for p, t in timings.items() if t.images_per_s >= floor]
    chosen = min(tied, key=lambda p: (timings[p].single_p50_ms, p.instances))
    summary = "; ".join(f"{p.name}: {t.images_per_s:.1f} img/s at batch 32 x 4 (rounds spread "
                        f"{t.spread:.0%}), single image p50 {t.single_p50_ms:.1f} ms"
                        for p, t in timings.items())  # fmt: skip
    return chosen, (
        f"{chosen.name}: the lowest single-image p50 of the plans within "
        f"{tolerance:.0%} of the best batch throughput ({summary})"
    )
