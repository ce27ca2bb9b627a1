"""What to serve here: the one question the supervisor asks (``Selection.now`` at start,
``later`` in the background after ready, ``fallback`` when an automatic choice does not load),
and its one answer (``Serving``): the export, the profile and why, and how it is rendered (this
GPU model's engine cache, a CPU profile's core plan) with what the gates and timings found.

- named (``GATEWAY_TRITON_PROFILE``), or ``auto``: with a GPU the table or a calibration
  (profiles/gpu.py, profiles/calibrate.py); without one the choice recorded for this machine,
  else at the first start the export's gated INT8 files (FP32 where refused) serve at once
  while every gated CPU profile is timed at its best core plan in the background
  (profiles/cpu_auto.py), and the fastest is loaded in place (Triton's reload: no request
  fails) and recorded for the next start;
- every profile cheaper than FP32 held to its gate first (profiles/gates.py);
- a CPU profile's core plan: the settings', the one recorded here, else the table's until it is
  measured in the background (profiles/planner.py).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clip_gateway.config import plan
from clip_gateway.config.plan import GPU_FIGURES, CoreFigures
from clip_gateway.config.settings import CPU_PROFILES, Profile, RepositorySettings, Settings
from clip_gateway.model.spec import model_identity
from clip_gateway.profiles import bf16, cpu_auto, engines, gates, gpu, timing
from clip_gateway.profiles.gates import Verdict
from clip_gateway.profiles.host import Host
from clip_gateway.profiles.planner import RECORD as PLAN_RECORD
from clip_gateway.profiles.planner import Planner, ProfileTimer
from clip_gateway.profiles.plans import model_plan, plan_candidates

log = logging.getLogger(__name__)

#: When an automatically chosen profile does not load (an engine build failing, an unsupported
#: op): what to try next, within the same start-up budget. The CUDA EP runs any graph ONNX
#: Runtime can; an operator's explicit choice never falls back. A CPU profile chosen by ``auto``
#: that does not load (it loaded when timed; a changed machine, memory): ``cpu``.
FALLBACK: dict[Profile, Profile] = {"tensorrt": "cuda", "cpu-bf16": "cpu", "cpu-int8": "cpu",
                                    "cpu-int8-openvino": "cpu"}  # fmt: skip


@dataclass(frozen=True)
class Serving:
    """The answer: what serves, why, and how it is rendered."""

    profile: Profile
    reason: str
    export_dir: Path
    #: the profile whose graphs serve: ``cpu`` where a gate refused ``profile`` and its FP32
    #: fallback serves in its place
    served: Profile
    #: what the repository is rendered with: the profile, this GPU model's engine cache, a CPU
    #: profile's core plan (instances x threads)
    repository: RepositorySettings
    #: what /v1/models shows of the gates and timings (launcher/repository.py ``render``'s
    #: keyword arguments)
    notes: dict[str, Any]
    #: the core plan and what chose it ("": a GPU profile)
    planned: str = ""
    #: the worker plan's figures (config/plan.py)
    figures: CoreFigures = GPU_FIGURES
    #: something is still to be measured after ready (``Selection.later``): Triton must be able
    #: to load the models again
    later: bool = False

    def line(self) -> str:
        """What the ready line says of it."""
        planned = f"; {self.planned}" if self.planned else ""
        return f"Triton {self.profile} profile ({self.reason}{planned})"


class Selection:
    """One launch's answers, and what it measured on the way."""

    def __init__(
        self,
        settings: Settings,
        host: Host,
        *,
        cpu_timer: cpu_auto.Timer | None = None,
        plan_timer: ProfileTimer | None = None,
    ) -> None:
        self.settings = settings
        self.host = host
        #: ``auto`` without a GPU: times a CPU profile (default: its plans, each through a
        #: Triton of its own); a CPU profile's core plan: times one plan (likewise)
        self.cpu_timer = cpu_timer
        self.plan_timer = plan_timer
        self.automatic = settings.repository.profile == "auto"
        self.measuring = settings.launch.plan_measure_s > 0
        self.gates = gates.for_launch(settings, host)
        self.thresholds = gates.thresholds(settings)
        #: the settings, with this GPU model's engine cache once the model is known
        self.repository = settings.repository
        self.identity = ""
        self.planner: Planner | None = None
        #: ``auto`` without a GPU: what it measured and chose, shown on every tower in /v1/models
        self.profile_choice: dict[str, Any] | None = None
        #: ``auto``'s first start on this machine: the choice is measured after ready
        self.choose_later = False
        self.runtimes_read: dict[str, dict[str, str]] = {}

    def now(self, deadline: float) -> Serving:
        """At start: what serves at once."""
        named = self.settings.repository.profile
        found = gpu.detect() if self.automatic else None
        # auto without a GPU makes cpu-int8's files too, in the background at the first start
        export_dir = self.host.export(int8=named == "cpu-int8")
        self.identity = model_identity(gates.manifest(export_dir))
        if found is not None:
            memory = "memory unknown" if found.memory_gib is None else f"{found.memory_gib:.0f} GiB"
            log.info("GPU: %s, compute capability %s, %s", found.name, found.compute_capability,
                     memory)  # fmt: skip
        self.repository = self.engine_cache(found)
        if self.automatic and found is None:
            export_dir, profile, reason = self.auto_cpu(export_dir, deadline)
        else:
            profile, reason = self.choose_gpu(export_dir, found, deadline)
        return self.answer(profile, reason, export_dir, deadline, later=self.choose_later)

    def later(self, serving: Serving, deadline: float) -> Serving:
        """After ready, in the background: the CPU profiles timed (``auto``'s first start
        here), then the chosen profile's core plans where none is recorded for this machine;
        what is then to be loaded in place."""
        chosen = serving
        if self.choose_later:
            # cpu-int8's files, quantized now if the export has none yet (as at a fresh start)
            self.host.export(int8=True)
            profile, reason, verdict = self.race(serving.export_dir, deadline)
            chosen = self.answer(profile, reason, serving.export_dir, deadline, verdict=verdict)
        if self.planner_for(serving.export_dir).settle(chosen.served, self.measuring):
            self.measure_plan(chosen.served, serving.export_dir, deadline)
        return self.planned(dataclasses.replace(chosen, later=False))

    def loaded(self, before: Serving, after: Serving) -> str:
        """What the log says once ``later``'s answer is loaded in place of ``before``."""
        if not self.choose_later:
            return f"Triton {after.profile} profile: {after.planned}, loaded in place"
        change = "stays" if after.profile == before.profile else f"replaces {before.profile}"
        return f"auto: {after.line()} {change}, loaded in place"

    def fallback(self, serving: Serving, error: str, deadline: float) -> Serving | None:
        """What serves when ``serving`` did not load (``error``: Triton's start said why): its
        fallback where ``auto`` chose it, else None (an operator's choice never falls back)."""
        instead = FALLBACK.get(serving.profile) if self.automatic else None
        if instead is None:
            return None
        why = (error.splitlines() or [error])[0]
        log.error("the %s profile did not load (%s); falling back to %s; the Triton log above "
                  "says why", serving.profile, why, instead)  # fmt: skip
        reason = f"{serving.profile} did not load: {why}"
        return self.answer(instead, reason, serving.export_dir, deadline)

    def answer(
        self,
        profile: Profile,
        reason: str,
        export_dir: Path,
        deadline: float,
        *,
        verdict: Verdict | None = None,
        later: bool = False,
    ) -> Serving:
        """``profile`` held to its gate (``verdict``: held to it moments ago), with its core
        plan looked up (``later``: something else is measured after ready too)."""
        served, notes = profile, {"gate": self.thresholds.as_dict()}
        if self.profile_choice is not None:
            notes["profile_choice"] = self.profile_choice
        if (gated := self.gates.get(profile)) is not None:
            verdict = verdict or gated.check(export_dir, deadline)
            fell_back = gates.enforce(gated, verdict, automatic=self.automatic,
                                      progress=self.host.progress)  # fmt: skip
            if fell_back is not None:
                served, reason = "cpu", fell_back
            notes |= verdict.notes
        repository = self.repository.model_copy(update={"profile": profile})
        serving = Serving(profile, reason, export_dir, served, repository, notes, later=later)
        if served not in CPU_PROFILES:
            return serving
        measure = self.planner_for(export_dir).settle(served, self.measuring)
        return self.planned(dataclasses.replace(serving, later=measure or later))

    def planned(self, serving: Serving) -> Serving:
        """``serving`` with a CPU profile's core plan as the planner has it now."""
        if serving.served not in CPU_PROFILES:
            return serving
        planner = self.planner_for(serving.export_dir)
        section, model = planner.section_for(serving.served), planner.plan(serving.served)
        log.info("core plan: %d model instance(s) x %d ORT thread(s) per tower", model.instances,
                 model.threads)  # fmt: skip
        update = {"instance_count": model.instances, "cpu_threads": model.threads}
        return dataclasses.replace(
            serving,
            repository=serving.repository.model_copy(update=update),
            notes=serving.notes | {"core_plan": section},
            planned=planner.describe(serving.served),
            figures=planner.figures(serving.served),
        )

    def engine_cache(self, found: gpu.GpuInfo | None) -> RepositorySettings:
        """The settings with the TensorRT engine cache for this GPU model, model identity and
        build (profiles/engines.py)."""
        base = self.settings.repository
        # engines are built by a GPU profile only: no GPU, no versions to look for
        tensorrt, onnxruntime = (engines.runtime_versions(self.host.backend_dir())
                                 if found is not None else ("unknown", "unknown"))  # fmt: skip
        build = engines.build_key(base.max_batch_size, max(base.preferred),
                                  base.trt_workspace_bytes, tensorrt=tensorrt,
                                  onnxruntime=onnxruntime)  # fmt: skip
        directory = engines.cache_dir(base.trt_cache_path, found.name if found else None,
                                      self.identity, build)  # fmt: skip
        return base.model_copy(update={"trt_cache_path": str(directory)})

    def choose_gpu(
        self, export_dir: Path, found: gpu.GpuInfo | None, deadline: float
    ) -> tuple[Profile, str]:
        """A named profile, or ``auto`` with a GPU: the table, or a calibration (opt-in) that
        measures within the start-up budget with the engine cache serving will use, so its
        TensorRT build is not wasted."""
        server = self.settings.server
        workers = plan.plan_for(plan.planned_workers(server), server.decode_threads,
                                server.max_decode_mib, figures=GPU_FIGURES)  # fmt: skip
        callers = max(4, 4 * workers.workers)  # several requests in flight per worker

        def timer(profile: Profile, budget: float) -> list[float]:
            repository = self.repository.model_copy(update={"profile": profile})
            return timing.batch_mix(self.host, repository, export_dir, budget_s=budget,
                                    callers=callers)  # fmt: skip

        return gpu.choose(self.settings.repository.profile, found, model=self.identity,
                          record=Path(self.repository.trt_cache_path) / engines.CALIBRATION_NAME,
                          calibrate_now=self.settings.launch.calibrate, timer=timer,
                          deadline=deadline)  # fmt: skip

    def auto_cpu(self, export_dir: Path, deadline: float) -> tuple[Path, Profile, str]:
        """``auto`` without a GPU, at start: the export, the profile and why. The choice
        recorded for this machine; else (the first start here) the export's INT8 files where
        they pass the gate, else FP32, while the CPU profiles are timed after ready."""
        if (recorded := self.recorded_choice(export_dir)) is not None:
            profile, reason = recorded
            if profile == "cpu-int8":  # a new cache volume, or the export made again
                export_dir = self.host.export(int8=True)
            return export_dir, profile, reason
        self.choose_later = True
        first = "auto, first start here:"
        later = "while the CPU profiles are built and timed in the background"
        refused = self.gates["cpu-int8"].check(export_dir, deadline).refused
        if refused is None:
            return export_dir, "cpu-int8", f"{first} the export's INT8 files serve {later}"
        if not (gates.manifest(export_dir).get("int8") or {}).get("files"):
            return export_dir, "cpu", f"{first} FP32 serves {later}"
        return export_dir, "cpu", f"{first} FP32 serves ({refused}) {later}"

    def recorded_choice(self, export_dir: Path) -> tuple[Profile, str] | None:
        """``auto`` without a GPU: the choice recorded for this machine and model, if any."""
        signature, records = self.signature(export_dir)
        for record in records:
            if (choice := cpu_auto.recorded(record, signature)) is not None:
                self.profile_choice = choice.section(f"measured here earlier ({record})")
                return choice.profile, f"auto, measured here earlier: {choice.reason}"
        return None

    def race(self, export_dir: Path, deadline: float) -> tuple[Profile, str, Verdict | None]:
        """``auto`` without a GPU: the choice recorded for this machine and model, else the
        fastest CPU profile that passes its gate, timed now within ``auto_measure_s``; the
        winner's verdict, where its gate was held now."""
        if (recorded := self.recorded_choice(export_dir)) is not None:
            return *recorded, None
        signature, records = self.signature(export_dir)
        verdicts = {profile: each.check(export_dir, deadline)
                    for profile, each in self.gates.items()}  # fmt: skip
        candidates = {p: verdicts[p].refused if p in verdicts else None
                      for p in cpu_auto.CANDIDATES}  # fmt: skip
        budget = min(self.settings.launch.auto_measure_s, deadline - time.monotonic())
        timed = ", ".join(p for p, why in candidates.items() if why is None)
        self.host.progress(f"auto: timing {timed} through Triton on this machine, each at its "
                           f"best core plan (at most {budget:.0f} s, once)")  # fmt: skip
        timer = self.cpu_timer or self.race_timer(export_dir)
        choice = cpu_auto.measure(candidates, timer, signature, budget_s=budget)
        kept = cpu_auto.keep(choice, records)
        self.profile_choice = choice.section(f"measured now (kept in {kept})")
        reason = f"auto, measured now in {choice.seconds:.0f} s: {choice.reason}"
        return choice.profile, reason, verdicts.get(choice.profile)

    def race_timer(self, export_dir: Path) -> cpu_auto.Timer:
        """Times a CPU profile as it would serve, at its best plan: its candidate plans measured
        now where none is recorded or set (profiles/planner.py ``Planner.race``)."""
        planner = self.planner_for(export_dir)
        one = self.plan_timer or functools.partial(timing.time_plan, self.host, self.repository,
                                                   export_dir)  # fmt: skip

        def timer(profile: Profile, budget: float) -> list[float]:
            return planner.race(profile, functools.partial(one, profile), budget, self.measuring)

        return timer

    def measure_plan(self, profile: Profile, export_dir: Path, deadline: float) -> None:
        """Time ``profile``'s candidate core plans within ``plan_measure_s`` (once per machine:
        the choice is kept) and make the rule's choice the one rendered from now on."""
        planner = self.planner_for(export_dir)
        budget = min(self.settings.launch.plan_measure_s, deadline - time.monotonic())
        names = ", ".join(p.name for p in plan_candidates(planner.cpus))
        self.host.progress(f"core plan: timing {profile} as {names} (instances x threads) through "
                           f"Triton on this machine (at most {budget:.0f} s, once)")  # fmt: skip
        one = self.plan_timer or functools.partial(timing.time_plan, self.host, self.repository,
                                                   export_dir)  # fmt: skip
        planner.measure(profile, functools.partial(one, profile), budget)

    def planner_for(self, export_dir: Path) -> Planner:
        """The CPU profiles' core plans for this machine, model and runtimes (recorded beside
        the export, as the profile choice), made once."""
        if self.planner is None:
            machine, records = self.signature(export_dir)
            base = {k: v for k, v in machine.items() if k not in ("gate", "plans")}
            records = [record.with_name(PLAN_RECORD) for record in records]
            self.planner = Planner(self.repository.instance_count, self.repository.cpu_threads,
                                   plan.usable_cpus(), base, records)  # fmt: skip
        return self.planner

    def signature(self, export_dir: Path) -> tuple[dict[str, Any], list[Path]]:
        """What a recorded CPU choice is valid for, and where it is kept."""
        repository = self.repository
        # the gate's thresholds too: a stricter gate may refuse what was chosen
        cpus = plan.usable_cpus()
        fixed = bool(repository.instance_count or repository.cpu_threads)
        plans: dict[str, tuple[int, int] | str] = {}
        for profile in cpu_auto.CANDIDATES:
            found = model_plan(profile, cpus, repository.instance_count, repository.cpu_threads)
            measured = self.measuring and not fixed
            plans[profile] = "measured here" if measured else (found.instances, found.threads)
        signature = cpu_auto.signature(cpu=cpu_auto.cpu_model(), flags=bf16.cpu_flags(), cpus=cpus,
                                       runtimes=self.runtimes(repository.cpu_backend),
                                       backend=repository.cpu_backend, model=self.identity,
                                       gate=self.thresholds.as_dict(), plans=plans)  # fmt: skip
        # beside the export (the model cache); a read-only baked export: the cache volume
        records = [export_dir / cpu_auto.RECORD,
                   Path(repository.trt_cache_path) / cpu_auto.RECORD]  # fmt: skip
        return signature, records

    def runtimes(self, cpu_backend: str) -> dict[str, str]:
        """The CPU runtimes' versions in the Triton env (and the native backend's), read once."""
        if cpu_backend not in self.runtimes_read:
            found = cpu_auto.runtime_versions(self.host.python())
            if cpu_backend == "onnxruntime":
                found["onnxruntime-backend"] = engines.runtime_versions(self.host.backend_dir())[1]
            self.runtimes_read[cpu_backend] = found
        return dict(self.runtimes_read[cpu_backend])
