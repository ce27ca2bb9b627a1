"""The CPU profiles' core plan (instances x threads per tower) measured on this machine, once:
each candidate (profiles/plans.py ``plan_candidates``: 1 x N, 2 x N/2, ...) served by a
tritonserver of its own and timed for batch-32 throughput from 4 callers and for one image's
latency (profiles/timing.py ``time_plan``); the rule (``choose_model_plan``) picks; the choice is
kept beside the export (``core-plan.json``), keyed by a machine signature as ``auto``'s profile
choice is (profiles/cpu_auto.py), and reused until the signature changes. Settings that fix the
plan (GATEWAY_TRITON_INSTANCE_COUNT, _CPU_THREADS) skip all of it.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from clip_gateway.config.plan import CPU_FIGURES, CoreFigures
from clip_gateway.config.processes import Interrupted
from clip_gateway.profiles.plans import (
    ModelPlan,
    PlanTiming,
    choose_model_plan,
    model_plan,
    plan_candidates,
)

log = logging.getLogger(__name__)

RECORD = "core-plan.json"
#: Times one plan of the profile within ``budget_s`` seconds.
Timer = Callable[[ModelPlan, float], PlanTiming]
#: Times one plan of a profile (profiles/timing.py ``time_plan`` with its host bound).
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


@dataclass
class Planner:
    """One launch's model plan for the CPU profiles: the settings' when they fix it, else the
    one recorded for this machine and profile, else the table's (``model_plan``) until measured.
    The choice (profiles/choice.py) asks it which plan to render, whether to measure, and
    measures through it."""

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
        """``auto``'s profile race (profiles/cpu_auto.py): the profile's batch-32 x 4 images/s
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
