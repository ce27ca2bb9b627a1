"""The CPU profiles' model plan (instances x threads per tower) measured on this machine, once:
each candidate (config/plan.py ``plan_candidates``: 1 x N, 2 x N/2, ...) served by a tritonserver
of its own and timed for batch-32 throughput from 4 callers and for one image's latency; the
rule (``choose_model_plan``) picks; the choice is kept beside the export, keyed by a machine
signature as ``auto``'s profile choice is (launcher/cpu_auto.py), and reused until the signature
changes. Settings that fix the plan (GATEWAY_TRITON_INSTANCE_COUNT, _CPU_THREADS) skip all of it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from clip_gateway.config.plan import (
    CPU_FIGURES,
    CoreFigures,
    ModelPlan,
    PlanTiming,
    choose_model_plan,
    model_plan,
    plan_candidates,
)
from clip_gateway.config.processes import Interrupted
from clip_gateway.config.settings import Settings
from clip_gateway.model.contract import TEXT_MODEL_NAME, TRITON_MODEL_NAME

log = logging.getLogger(__name__)

RECORD = "core-plan.json"
#: Callers at once for the throughput figure, each sending batches of ``BATCH`` (the issue's
#: reference load, as ``auto``'s profile timing).
CALLERS = 4
BATCH = 32
#: Counted throughput rounds after a warm-up round, at most (at least two, however short the
#: budget: their spread says how far apart two plans must be to differ, config/plan.py
#: ``choose_model_plan``; a slow machine overruns the budget instead); the median counts.
ROUNDS = 3
#: Of a candidate's time once READY: the share spent on single images (each one image, one
#: caller, one after another); the rest on batches.
LATENCY_SHARE = 0.25
#: Single images timed per candidate: at least (the p50 of fewer is noise), at most.
SINGLES = (5, 60)
#: Each request's own deadline (a batch of 32 from 4 callers on a loaded 2-CPU machine takes
#: seconds; the round's time box, not this, bounds the measurement).
REQUEST_S = 120.0
#: A candidate's Triton may take this long to be READY even past its share of the budget: on a
#: loaded machine a start takes seconds more, and a plan that lost for that would be a plan
#: never measured (the budget is overrun instead, as by the rounds' last requests).
START_S = 60.0

#: Times one plan of the profile within ``budget_s`` seconds.
Timer = Callable[[ModelPlan, float], PlanTiming]
#: Times one plan of a profile (``time_plan`` with its launch bound).
ProfileTimer = Callable[[str, ModelPlan, float], PlanTiming]


@dataclass(frozen=True)
class PlanChoice:
    profile: str
    #: the chosen plan, ``instances`` x ``threads`` (``ModelPlan.name``)
    plan: str
    reason: str
    #: what the record is valid for
    signature: dict[str, Any]
    #: per measured plan: ``images_per_s`` (batch 32 x 4) and ``single_p50_ms``
    timings: dict[str, dict[str, float]] = field(default_factory=dict)
    #: why a candidate could not be measured
    failures: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def model_plan(self) -> ModelPlan:
        return ModelPlan.parse(self.plan)

    def figure(self) -> str:
        """The chosen plan's own figures, for the ready line."""
        found = self.timings.get(self.plan)
        if found is None:
            return self.reason
        return (f"single image p50 {found['single_p50_ms']:.1f} ms, "
                f"{found['images_per_s']:.1f} img/s at batch 32 x 4")  # fmt: skip

    def section(self, source: str) -> dict[str, Any]:
        """What /v1/models shows (each tower's ``quantization.core_plan``)."""
        plan = self.model_plan
        return {"instances": plan.instances, "threads": plan.threads, "by": source,
                "rule": "lowest single-image p50 within 5 % (or the rounds' spread, at most 20 %) "
                        "of the best batch-32 x 4 images/s",
                "measured": self.timings, "failed": self.failures,
                "measured_s": round(self.seconds, 1),
                "machine": {k: self.signature.get(k)
                            for k in ("cpu", "cpus", "runtimes")}}  # fmt: skip

    def figures(self, gateway_us: float) -> CoreFigures | None:
        """The worker plan's figures from this measurement: the model's CPU per image is every
        usable CPU over the chosen plan's images/s."""
        found = self.timings.get(self.plan)
        cpus = self.signature.get("cpus")
        if not found or not found["images_per_s"] or not isinstance(cpus, int):
            return None
        return CoreFigures(gateway_us, cpus * 1e6 / found["images_per_s"], 1,
                           f"the {self.profile} plan measured here")  # fmt: skip


def recorded(records: Sequence[Path], profile: str, wanted: Mapping[str, Any]) -> PlanChoice | None:
    """The plan recorded for ``profile`` in the first readable record, if it was measured for
    exactly this signature."""
    for record in records:
        try:
            data = json.loads(record.read_text())["plans"][profile]
            choice = PlanChoice(**data)
        except (OSError, ValueError, TypeError, KeyError):
            continue
        if choice.signature == dict(wanted):
            return choice
    return None


def keep(choice: PlanChoice, records: Sequence[Path]) -> Path | None:
    """Add the choice to the first of ``records`` that can be written (the other profiles'
    plans kept there stay); where it went."""
    for record in records:
        try:
            data = json.loads(record.read_text()) if record.exists() else {}
        except (OSError, ValueError):
            data = {}
        plans = data.get("plans")
        plans = dict(plans) if isinstance(plans, dict) else {}
        data = {"plans": plans | {choice.profile: asdict(choice)}}
        try:
            record.parent.mkdir(parents=True, exist_ok=True)
            record.write_text(json.dumps(data, indent=1))
            return record
        except OSError as exc:
            log.info("cannot keep the core plan at %s (%s)", record, exc)
    log.warning("the core plan could not be kept: the next start measures again")
    return None


def measure(
    profile: str,
    candidates: Sequence[ModelPlan],
    timer: Timer,
    sig: Mapping[str, Any],
    *,
    budget_s: float,
    provisional: ModelPlan,
    clock: Callable[[], float] = time.monotonic,
) -> PlanChoice:
    """Time every candidate in an equal share of ``budget_s``; the rule picks. One candidate
    (one CPU): chosen without timing. None measured: ``provisional`` (the table's plan)."""
    started = clock()
    if len(candidates) == 1:
        (only,) = candidates
        return PlanChoice(profile, only.name, "the only plan on one CPU", dict(sig))
    share = budget_s / len(candidates)
    timings: dict[ModelPlan, PlanTiming] = {}
    failures: dict[str, str] = {}
    for candidate in candidates:
        try:
            timings[candidate] = timer(candidate, share)
        except Interrupted:
            raise
        except Exception as exc:  # a plan that does not load or answer loses, saying why
            text = str(exc).strip()
            failures[candidate.name] = text.splitlines()[0] if text else type(exc).__name__
            log.warning("core plan: %s %s could not be measured: %s", profile, candidate.name,
                        failures[candidate.name])  # fmt: skip
    seconds = clock() - started
    found = {p.name: {"images_per_s": round(t.images_per_s, 1),
                      "single_p50_ms": round(t.single_p50_ms, 1), "spread": round(t.spread, 3)}
             for p, t in timings.items()}  # fmt: skip
    if not timings:
        why = "; ".join(f"{p}: {w}" for p, w in failures.items())
        return PlanChoice(profile, provisional.name, f"nothing measured ({why}); the table's plan",
                          dict(sig), found, failures, seconds)  # fmt: skip
    chosen, reason = choose_model_plan(timings)
    return PlanChoice(profile, chosen.name, reason, dict(sig), found, failures, seconds)


def time_plan(
    profile: str,
    plan: ModelPlan,
    budget_s: float,
    *,
    export_dir: Path,
    settings: Settings,
    stop: threading.Event,
) -> PlanTiming:
    """``plan`` of ``profile`` served by a tritonserver of its own (the image tower only: the
    plan is the same for both, the image tower is the heavier), READY within ``budget_s``; the
    rest of the budget split between single images and batch-32 rounds from ``CALLERS``
    callers, each batch split between the instances as the gateway splits a request
    (pipeline/service.py). Stopped here, in a private scratch directory."""
    from clip_gateway.launcher.local import LocalTriton
    from clip_gateway.launcher.repository import render

    deadline = time.monotonic() + budget_s
    planned = {"profile": profile, "instance_count": plan.instances, "cpu_threads": plan.threads}
    repository = settings.repository.model_copy(update=planned)
    with tempfile.TemporaryDirectory(prefix="clip-gateway-plan-") as scratch:
        rendered = render(repository, export_dir, Path(scratch) / "model_repository")
        shutil.rmtree(rendered / TEXT_MODEL_NAME, ignore_errors=True)
        log_file = settings.launch.log_file
        triton = LocalTriton(rendered, inherit_output=log_file is None, log_path=log_file,
                             stop_requested=stop)  # fmt: skip
        try:
            triton.start(timeout=max(START_S, deadline - time.monotonic()))
            return asyncio.run(_timed(triton.grpc_url, plan.instances, deadline, stop))
        finally:
            triton.stop()
            triton.release_ports()


async def _timed(url: str, instances: int, deadline: float, stop: threading.Event) -> PlanTiming:
    from clip_gateway.backend.protocol import ImageBatch
    from clip_gateway.backend.triton import TritonBackend

    backend = TritonBackend(url, TRITON_MODEL_NAME)
    try:
        info = await backend.model_info()
        shape = (info.image_size, info.image_size, 3)
        pixels = np.random.default_rng(0).integers(0, 256, (BATCH, *shape), dtype=np.uint8)
        batch, single = ImageBatch(pixels), ImageBatch(pixels[:1].copy())
        chunk = -(-BATCH // max(1, instances))

        async def embed(images: ImageBatch) -> None:
            await backend.embed_images(images, deadline=time.monotonic() + REQUEST_S)

        async def request() -> int:  # one request of 32, shared between the instances
            parts = [batch.rows(i, min(BATCH, i + chunk)) for i in range(0, BATCH, chunk)]
            await asyncio.gather(*(embed(part) for part in parts))
            return BATCH

        async def caller(until: float) -> int:
            sent = await request()
            while time.monotonic() < until and not stop.is_set():
                sent += await request()
            return sent

        for _ in range(2):  # warm-up: both shapes, every instance
            await asyncio.gather(request(), embed(single))
        window = max(0.0, deadline - time.monotonic())
        latencies: list[float] = []
        singles_until = time.monotonic() + window * LATENCY_SHARE
        while len(latencies) < SINGLES[1] and (
            len(latencies) < SINGLES[0] or time.monotonic() < singles_until
        ):
            if stop.is_set():
                raise Interrupted("stop requested while timing the core plan")
            started = time.perf_counter()
            await embed(single)
            latencies.append(time.perf_counter() - started)
        # the first round warms up (not counted); then two rounds, and a third if it fits
        rates: list[float] = []
        took = 0.0
        while len(rates) <= ROUNDS:
            if stop.is_set():
                raise Interrupted("stop requested while timing the core plan")
            left = deadline - time.monotonic()
            if len(rates) >= 3 and left < took:
                break
            started = time.perf_counter()
            until = time.monotonic() + max(0.0, left) / (ROUNDS + 1 - len(rates))
            images = await asyncio.gather(*(caller(until) for _ in range(CALLERS)))
            took = time.perf_counter() - started
            rates.append(sum(images) / took)
        counted = rates[1:]
        median = statistics.median(counted)
        spread = (max(counted) - min(counted)) / median if median else 0.0
        return PlanTiming(median, 1000 * statistics.median(latencies), spread)
    finally:
        await backend.close()


@dataclass
class Planner:
    """One launch's model plan for the CPU profiles: the settings' when they fix it, else the
    one recorded for this machine and profile, else the table's (``model_plan``) until measured.
    The supervisor asks it which plan to render, whether to measure, and measures through it."""

    #: GATEWAY_TRITON_INSTANCE_COUNT, GATEWAY_TRITON_CPU_THREADS (0: unset)
    instances: int
    threads: int
    cpus: int
    #: the machine's signature (CPU, flags, usable cores, runtimes, backend, model identity);
    #: a profile's record holds for it plus the profile
    machine: dict[str, Any]
    #: where records are read, and kept (the first writable)
    records: list[Path]
    choice: PlanChoice | None = None
    #: the plans measured by this launch, per profile, and where each was kept
    measured: dict[str, tuple[PlanChoice, Path | None]] = field(default_factory=dict)
    #: the profile ``section`` is about
    settled: str | None = None
    #: what /v1/models shows of the plan that serves (``quantization.<tower>.core_plan``)
    section: dict[str, Any] | None = None

    def signature(self, profile: str) -> dict[str, Any]:
        return self.machine | {"profile": profile}

    @property
    def fixed(self) -> bool:
        return bool(self.instances or self.threads)

    def plan(self, profile: str) -> ModelPlan:
        """The plan to render ``profile`` with now."""
        if not self.fixed and self.choice is not None and self.choice.profile == profile:
            return self.choice.model_plan
        return model_plan(profile, self.cpus, self.instances, self.threads)

    def settle(self, profile: str, measuring: bool = True) -> bool:
        """Look ``profile``'s plan up (settings, then the record); True when it is still to be
        measured (the table's serves meanwhile; ``measuring`` False: it will not be)."""
        planned = self.plan(profile)
        self.settled = profile
        if self.fixed:
            self.choice = None
            self.section = {"instances": planned.instances, "threads": planned.threads,
                            "by": "settings (GATEWAY_TRITON_INSTANCE_COUNT, "
                                  "GATEWAY_TRITON_CPU_THREADS)"}  # fmt: skip
            return False
        if profile in self.measured:
            self.choice, kept = self.measured[profile]
            self.section = self.choice.section(f"measured now (kept in {kept})")
            return False
        for record in self.records:
            if (found := recorded([record], profile, self.signature(profile))) is not None:
                self.choice = found
                self.section = found.section(f"measured here earlier ({record})")
                return False
        self.choice = None
        planned = self.plan(profile)
        by = "the table (CPU_MODEL_INSTANCES)" + (
            " until measured here" if measuring else ": GATEWAY_PLAN_MEASURE_S=0, not measured"
        )
        self.section = {"instances": planned.instances, "threads": planned.threads, "by": by}
        return measuring

    def measure(self, profile: str, timer: Timer, budget_s: float) -> PlanChoice:
        """Time ``profile``'s candidate plans, keep the choice, serve it from now on."""
        choice = measure(profile, plan_candidates(self.cpus), timer, self.signature(profile),
                         budget_s=budget_s, provisional=model_plan(profile, self.cpus))  # fmt: skip
        kept = keep(choice, self.records)
        self.measured[profile] = (choice, kept)
        self.choice, self.settled = choice, profile
        self.section = choice.section(f"measured now (kept in {kept})")
        return choice

    def race(self, profile: str, timer: Timer, budget_s: float, measuring: bool) -> list[float]:
        """``auto``'s profile race (launcher/cpu_auto.py): the profile's batch-32 x 4 images/s
        with the plan it would serve: its candidate plans measured now (``measuring``, none
        recorded; the rule's choice is kept and counts), else the one the settings, its record
        or the table give, timed alone. A profile is so compared at its best plan, not at the
        table's (on this 2-core Xeon cpu-int8's table plan, 2 x 1, gave 16.2 images/s through
        the gateway where 1 x 2 gave 28.2)."""
        if self.settle(profile, measuring):
            choice = self.measure(profile, timer, budget_s)
            found = choice.timings.get(choice.plan)
            if found is None:
                raise RuntimeError(choice.reason)
            return [found["images_per_s"]]
        return [timer(self.plan(profile), budget_s).images_per_s]

    def section_for(self, profile: str) -> dict[str, Any] | None:
        """What /v1/models shows of ``profile``'s plan (looked up if another was)."""
        if self.settled != profile:
            self.settle(profile)
        return self.section

    def figures(self, profile: str) -> CoreFigures:
        """The worker plan's figures: the model's CPU per image from this profile's measured
        plan, else the committed ones (config/plan.py ``CPU_FIGURES``)."""
        if self.choice is not None and self.choice.profile == profile:
            measured = self.choice.figures(CPU_FIGURES.gateway_us)
            if measured is not None:
                return measured
        return CPU_FIGURES

    def describe(self, profile: str) -> str:
        """The plan and the figure it was chosen by, for the ready line."""
        planned = self.plan(profile)
        name = f"{planned.instances} instance(s) x {planned.threads} thread(s) per tower"
        if self.choice is not None and self.choice.profile == profile and not self.fixed:
            return f"core plan {name}, measured here: {self.choice.figure()}"
        by = (self.section or {}).get("by", "the table")
        return f"core plan {name} ({by})"
