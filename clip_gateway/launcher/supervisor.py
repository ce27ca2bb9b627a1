"""The one launch path: ``make serve``, ``clip-gateway serve`` and the container entrypoint.

1. the model: a baked export directory, or the export cache (built by
   ``python -m clip_gateway.export`` in a child process on first use: torch never enters this
   process or the server's);
2. the Triton profile: named, or chosen for the GPU found (launcher/profiles.py); ``auto``
   without a GPU, the choice recorded for this machine, else at the first start the export's
   gated INT8 files (FP32 where refused) serve at once while the CPU profiles are built, gated
   and timed in the background; the fastest is then loaded into the serving Triton in place
   (Triton's reload: no request fails), and recorded for the next start;
3. the model repository, rendered into a private scratch directory;
4. tritonserver on loopback, READY (TensorRT engine builds included) within the start-up budget;
   an automatically chosen profile that does not load falls back (tensorrt → cuda);
5. the gateway's HTTP process on the public socket, bound here, with the worker plan;
6. supervision: SIGTERM, SIGINT or SIGHUP, or either child dying, ends it: after the stop delay
   (still serving, while endpoints and load balancers let go) the gateway stops accepting and
   drains, then Triton stops, then the scratch directory goes. A signal during start-up stops
   at once: nothing is in flight, so a model load or engine build is abandoned (Triton gets a
   short grace, then SIGKILL) and half-built engines are removed. A second signal skips the
   stop delay. Children get SIGTERM by themselves if this process is killed.
Every bound comes from config/timings.py.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from clip_gateway.config import plan, timings
from clip_gateway.config.processes import (
    GatewayProcess,
    Interrupted,
    LaunchError,
    ProcessStartError,
)
from clip_gateway.config.settings import (
    CPU_PROFILES,
    Profile,
    RepositorySettings,
    Settings,
    exposure_problem,
    immich_protection,
)
from clip_gateway.imaging import paths
from clip_gateway.launcher import (
    bf16,
    calibrate,
    core_plan,
    cpu_auto,
    engines,
    int8_openvino,
    profiles,
    served_export,
)
from clip_gateway.launcher.local import LocalTriton, TritonInstall, otel_trace_args, otlp_traces_url
from clip_gateway.launcher.repository import default_templates, render, rendered_config
from clip_gateway.model import gate
from clip_gateway.model.contract import TEXT_MODEL_NAME, TRITON_MODEL_NAME
from clip_gateway.model.spec import immich_name, model_identity
from clip_gateway.observability.logs import configure
from clip_gateway.pipeline import decode_speed

log = logging.getLogger("gateway.supervisor")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: Exit codes: stopped on request, a child failed, the configuration cannot work.
OK, FAILED, MISCONFIGURED = 0, 1, 2


class Supervisor:
    def __init__(
        self,
        settings: Settings,
        progress: Callable[[str], None] | None = None,
        *,
        cpu_timer: cpu_auto.Timer | None = None,
        plan_timer: core_plan.ProfileTimer | None = None,
    ) -> None:
        self.settings = settings
        #: ``auto`` without a GPU: times a CPU profile (default: through a Triton of its own)
        self.cpu_timer = cpu_timer
        #: a CPU profile's core plan: times one plan (default: through a Triton of its own)
        self.plan_timer = plan_timer
        #: the CPU profiles' model plan: settings, record, or measured in the background
        self.planner: core_plan.Planner | None = None
        self.progress = progress or (lambda line: log.info("%s", line))
        self.timings = timings.derive(settings)
        self.stop_requested = threading.Event()
        #: a second stop signal: skip the stop delay
        self.hurry = threading.Event()
        self.stop_signal: int | None = None
        self.triton: LocalTriton | None = None
        self.triton_ready = False
        self.gateway: GatewayProcess | None = None
        self.scratch: Path | None = None
        #: ``cpu-int8`` refused by the quality gate and served as FP32 (GATEWAY_INT8_FALLBACK): why
        self.int8_fallback: str | None = None
        #: ``cpu-bf16``: what its gate measured, and why FP32 serves instead where it refused
        self.bf16: dict[str, Any] | None = None
        #: ``auto`` without a GPU: the measured figures and the choice, shown in /v1/models
        self.profile_choice: dict[str, Any] | None = None
        #: ``auto``'s first start: Triton may load the models again (the fastest profile, once
        #: measured by ``switcher`` in the background)
        self.reloadable = False
        self.switcher: threading.Thread | None = None
        #: how the gateway's workers were planned, for the ready line
        self.worker_reason = ""
        #: the served model's identity (model/spec.py ``model_identity``), once the export is found
        self.identity = ""
        #: the CPU runtimes' versions per CPU backend (a process start each to read)
        self.runtimes_read: dict[str, dict[str, str]] = {}

    def request_stop(self, signum: int, _frame: FrameType | None = None) -> None:
        # only flags here: printing from a signal handler can re-enter a stream's write
        if self.stop_requested.is_set():
            self.hurry.set()
        self.stop_signal = self.stop_signal or signum
        self.stop_requested.set()

    def run(self) -> int:
        """Start everything, supervise until a stop, stop everything; the exit code."""
        for signum in STOP_SIGNALS:
            signal.signal(signum, self.request_stop)
        try:
            self.start()
            return self.supervise()
        except Interrupted:
            self._stopping("during start-up")
            return OK
        except LaunchError as exc:
            log.error("%s", exc)
            return MISCONFIGURED
        except ProcessStartError as exc:
            log.error("start-up failed: %s", exc)
            return FAILED
        finally:
            self.shutdown()

    def export_only(self) -> int:
        """The export this start would serve, made if missing (``make serve`` runs it while
        the Triton environment installs); the exit code."""
        int8 = self.settings.repository.profile == "cpu-int8"
        try:
            # found, the serve that follows says so
            served_export.find_or_export(self.settings.launch, self.progress,
                                         self.stop_requested, int8=int8,
                                         say_found=False)  # fmt: skip
        except Interrupted:
            return OK
        except LaunchError as exc:
            log.error("%s", exc)
            return MISCONFIGURED
        return OK

    def start(self) -> None:
        launch = self.settings.launch
        exposure = exposure_problem(self.settings.server)
        if exposure is not None:
            raise LaunchError(exposure)
        if self.settings.server.anonymous:
            log.warning("GATEWAY_ANONYMOUS: serving without API keys on %s",
                        self.settings.server.host)  # fmt: skip
        if self.settings.server.immich:
            log.warning("GATEWAY_IMMICH: POST /predict serves Immich, which sends no API key: %s",
                        immich_protection(self.settings.server))  # fmt: skip
        deadline = time.monotonic() + launch.startup_timeout_s
        for problem in self.timings.problems():
            log.warning("%s", problem)
        automatic = self.settings.repository.profile == "auto"
        gpu = profiles.detect() if automatic else None
        # auto without a GPU makes cpu-int8's files too, in the background at the first start
        int8 = self.settings.repository.profile == "cpu-int8"
        export_dir = served_export.find_or_export(
            launch, self.progress, self.stop_requested, int8=int8
        )
        if self.settings.repository.profile == "cpu-int8":
            self.int8_fallback = self.int8_gate(export_dir)
        identity = model_identity(json.loads((export_dir / "manifest.json").read_text()))
        self.identity = identity
        if gpu is not None:
            memory = "memory unknown" if gpu.memory_gib is None else f"{gpu.memory_gib:.0f} GiB"
            log.info("GPU: %s, compute capability %s, %s", gpu.name, gpu.compute_capability,
                     memory)  # fmt: skip
        base = self.settings.repository
        # engines are built by a GPU profile only: no GPU, no versions to look for
        tensorrt, onnxruntime = (
            engines.runtime_versions(TritonInstall.discover().backend_dir)
            if gpu is not None
            else ("unknown", "unknown")
        )
        build = engines.build_key(base.max_batch_size, max(base.preferred),
                                  base.trt_workspace_bytes, tensorrt=tensorrt,
                                  onnxruntime=onnxruntime)  # fmt: skip
        engine_dir = engines.cache_dir(base.trt_cache_path, gpu.name if gpu else None, identity,
                                       build)  # fmt: skip
        repository = base.model_copy(update={"trt_cache_path": str(engine_dir)})
        choose_later = False
        if automatic and gpu is None:
            export_dir, profile, reason = self.auto_cpu(export_dir, identity, repository)
            choose_later = self.reloadable
        else:
            profile, reason = self.choose_profile(export_dir, gpu, identity, repository, deadline)
        if profile == "cpu-bf16":
            profile, reason = self.bf16_gate(export_dir, reason, deadline)
        if profile == "cpu-int8-openvino":
            self.int8_openvino_gate(export_dir, repository.cpu_backend, deadline)
        plan_later = self.plan_cpu(export_dir, repository, profile) and not choose_later
        self.scratch = Path(tempfile.mkdtemp(prefix="clip-gateway-", dir=launch.scratch_dir))
        profile, reason = self.start_model(repository, export_dir, profile, reason, deadline)
        assert self.triton is not None
        planned = ""
        if self.planner is not None and profile in CPU_PROFILES:
            planned = f"; {self.planner.describe(self.served(profile))}"
        self.progress(f"Triton {profile} profile ({reason}{planned}) READY in "
                      f"{self.triton.ready_seconds:.1f} s")  # fmt: skip
        self.gateway = gateway = self.gateway_process(export_dir, profile)
        gateway.start(timeout=deadline - time.monotonic())
        gateway.wait_ready(timeout=deadline - time.monotonic())
        self.say_ready(gateway)
        if choose_later or plan_later:
            self.switcher = threading.Thread(
                target=self.measure_and_switch,
                args=(export_dir, identity, repository, profile, choose_later),
                name="auto-measure", daemon=True,
            )  # fmt: skip
            self.switcher.start()

    def plan_cpu(self, export_dir: Path, repository: RepositorySettings, profile: Profile) -> bool:
        """A CPU profile's model plan, looked up for this machine; True when it is still to be
        measured: the table's plan serves at once (Triton reloadable), the measured one is
        loaded in place later."""
        if profile not in CPU_PROFILES:
            return False
        self.planner = self.make_planner(export_dir, repository)
        later = self.planner.settle(self.served(profile), self.settings.launch.plan_measure_s > 0)
        self.reloadable = self.reloadable or later
        return later

    def say_ready(self, gateway: GatewayProcess) -> None:
        workers, threads = gateway.env["GATEWAY_WORKERS"], gateway.env["GATEWAY_DECODE_THREADS"]
        imaging = paths.current()
        self.progress(
            f"ready on {gateway.url} ({workers} worker(s) x {threads} decode thread(s), "
            f"{self.worker_reason}; resize: "
            f"{imaging.resize}{'' if imaging.simd else ', NOT the SIMD fast path'}); "
            "API docs at /docs"
        )

    def start_model(
        self,
        repository: RepositorySettings,
        export_dir: Path,
        profile: Profile,
        reason: str,
        deadline: float,
    ) -> tuple[Profile, str]:
        """Triton READY on ``profile``, or on its fallback when the profile was chosen
        automatically and does not load; the profile that runs, and why."""
        while True:
            try:
                self.start_triton(repository.model_copy(update={"profile": profile}),
                                  export_dir, deadline)  # fmt: skip
                return profile, reason
            except ProcessStartError as exc:
                automatic = self.settings.repository.profile == "auto"
                fallback = profiles.FALLBACK.get(profile) if automatic else None
                if fallback is None or time.monotonic() >= deadline:
                    raise
                why = str(exc).splitlines()[0]
                log.error("the %s profile did not load (%s); falling back to %s; the Triton log "
                          "above says why", profile, why, fallback)  # fmt: skip
                profile, reason = fallback, f"{profile} did not load: {why}"

    def start_triton(
        self, repository: RepositorySettings, export_dir: Path, deadline: float
    ) -> None:
        """Render ``repository.profile`` and start Triton on it, READY before ``deadline``.
        A TensorRT start holds the engine build lock while it may be building."""
        assert self.scratch is not None
        launch = self.settings.launch
        install = TritonInstall.discover()
        rendered = self.render_profile(repository, export_dir, self.scratch / "model_repository")
        lock = None
        if repository.profile == "tensorrt":
            lock = engines.BuildLock(Path(repository.trt_cache_path), self.stop_requested)
            try:
                lock.acquire(timeout=deadline - time.monotonic())
            except TimeoutError as exc:
                raise ProcessStartError(str(exc)) from exc
        traces = otlp_traces_url()
        self.triton_ready = False
        self.triton = LocalTriton(
            rendered,
            install=install,
            grpc_port=launch.triton_grpc_port,
            http_port=launch.triton_http_port,
            metrics_port=launch.triton_metrics_port,
            extra_args=otel_trace_args(traces) if traces else (),
            inherit_output=launch.log_file is None,
            log_path=launch.log_file,
            stop_requested=self.stop_requested,
            reloadable=self.reloadable,
        )
        try:
            self.triton.start(timeout=deadline - time.monotonic())
            self.triton_ready = True
        except BaseException:
            self.stop_triton()  # before the lock goes: it may still be writing engines
            raise
        finally:
            if lock is not None:
                lock.release(completed=self.triton_ready)

    def render_profile(
        self, repository: RepositorySettings, export_dir: Path, out_dir: Path
    ) -> Path:
        """``repository.profile`` rendered into ``out_dir`` with the core plan's instances and
        threads (CPU profiles) and what the gates measured."""
        install = TritonInstall.discover()
        section = None
        if repository.profile in CPU_PROFILES:
            served = self.served(repository.profile)
            if self.planner is None:  # made as soon as a CPU profile is chosen at start
                self.planner = self.make_planner(export_dir, repository)
            section = self.planner.section_for(served)
            model = self.planner.plan(served)
            repository = repository.model_copy(
                update={"instance_count": model.instances, "cpu_threads": model.threads}
            )
            log.info("core plan: %d model instance(s) x %d ORT thread(s) per tower",
                     model.instances, model.threads)  # fmt: skip
        rendered = render(repository, export_dir, out_dir,
                          int8_fallback=self.int8_fallback, bf16=self.bf16,
                          profile_choice=self.profile_choice, core_plan=section,
                          gate=self.thresholds().as_dict())  # fmt: skip
        backend = rendered_config(rendered).backend
        if not (install.backend_dir / backend).is_dir():
            raise LaunchError(
                f"the {repository.profile} profile needs Triton's {backend} backend, which "
                f"{install.backend_dir} lacks (GATEWAY_TRITON_CPU_BACKEND chooses the cpu "
                "profile's; GPU profiles need the NGC image)"
            )
        return rendered

    def int8_gate(self, export_dir: Path) -> str | None:
        """``cpu-int8``: the export's INT8 figures held to this launch's thresholds. Refused:
        a LaunchError saying why, or with GATEWAY_INT8_FALLBACK the reason (FP32 is served)."""
        launch = self.settings.launch
        manifest = json.loads((export_dir / "manifest.json").read_text())
        thresholds = gate.Thresholds(launch.int8_min_mean_cosine, launch.int8_min_cosine)
        refused = gate.refusal((manifest.get("int8") or {}).get("figures", {}), thresholds)
        if refused is None:
            return None
        if not launch.int8_fallback:
            raise LaunchError(
                f"{refused}. Serve FP32 with the cpu profile, or set GATEWAY_INT8_FALLBACK=true "
                "to fall back to it"
            )
        log.warning("%s; serving the FP32 files instead (GATEWAY_INT8_FALLBACK)", refused)
        self.progress(f"INT8 refused, serving FP32 (GATEWAY_INT8_FALLBACK): {refused}")
        return refused

    def bf16_gate(
        self, export_dir: Path, reason: str, deadline: float = math.inf
    ) -> tuple[Profile, str]:
        """``cpu-bf16``: only on a CPU with BF16 units, and only if OpenVINO's BF16 embeddings
        pass the INT8 gate's thresholds against FP32 (launcher/bf16.py). Refused: a LaunchError
        when named explicitly (unless GATEWAY_BF16_FALLBACK), else the ``cpu`` profile's
        FP32 graphs serve, the log and /v1/models saying why."""
        launch = self.settings.launch
        automatic = self.settings.repository.profile == "auto"
        thresholds = self.thresholds()
        if self.bf16 is not None and not self.bf16.get("fallback"):
            return "cpu-bf16", reason  # held to the gate moments ago, as a candidate of auto
        version, measured, refused = self.bf16_check(export_dir, deadline)
        if refused is None:
            self.bf16 = bf16.section(version, measured, thresholds, None)
            return "cpu-bf16", reason
        if not (automatic or launch.bf16_fallback):
            raise LaunchError(
                f"the cpu-bf16 profile is refused: {refused}. Serve the cpu or cpu-int8 "
                "profile, or set GATEWAY_BF16_FALLBACK=true to fall back to cpu"
            )
        log.warning("cpu-bf16 refused (%s); serving the cpu profile's FP32 graphs", refused)
        self.progress(f"BF16 refused, serving FP32 (cpu profile): {refused}")
        self.bf16 = bf16.section(version, measured, thresholds, refused)
        return "cpu-bf16", f"BF16 refused, FP32 serves: {refused}"

    def int8_openvino_gate(self, export_dir: Path, cpu_backend: str, deadline: float) -> None:
        """``cpu-int8-openvino``: built (or its build found) and its figures held to the gate;
        refused, a LaunchError saying why (an operator who named it chose INT8 on OpenVINO:
        nothing else is served in its place)."""
        refused = self.int8_openvino_check(export_dir, cpu_backend, deadline)
        if refused is not None:
            raise LaunchError(f"the cpu-int8-openvino profile is refused: {refused}. Serve the "
                              "cpu or cpu-int8 profile")  # fmt: skip

    def int8_openvino_check(
        self, export_dir: Path, cpu_backend: str, deadline: float
    ) -> str | None:
        """Why ``cpu-int8-openvino`` may not serve this export here, or None; builds its OpenVINO
        INT8 files at the first start for the model (launcher/int8_openvino.py)."""
        if cpu_backend != "python":
            return "OpenVINO runs in the Python backend only (GATEWAY_TRITON_CPU_BACKEND=python)"
        install = TritonInstall.discover()
        python = (install.python_bin_dir or Path("/usr/bin")) / "python3"
        script = default_templates() / "python" / "int8_openvino_build.py"
        rest = int8_openvino.rest_precision(bf16.cpu_flags())
        threads = plan.model_plan("cpu-int8-openvino", plan.usable_cpus()).threads
        if int8_openvino.kept(export_dir) is None:
            self.progress("cpu-int8-openvino: quantizing with NNCF (once per model; minutes)")
        started = time.monotonic()
        try:
            record = int8_openvino.figures(
                export_dir, python, script, threads, rest,
                timeout=max(1.0, min(int8_openvino.BUILD_SECONDS, deadline - time.monotonic())),
                stop=self.stop_requested.is_set,
            )  # fmt: skip
        except int8_openvino.Int8OpenvinoUnavailable as exc:
            return str(exc)
        log.info("cpu-int8-openvino: built or found in %.0f s: %s", time.monotonic() - started,
                 json.dumps(record.get("figures")))  # fmt: skip
        return int8_openvino.refusal(record, self.thresholds())

    def int8_refusal(self, int8: dict[str, Any]) -> str | None:
        """Why the export's INT8 files (its manifest's ``int8`` section) may not serve, or None."""
        if not int8.get("files"):
            return "the export has no INT8 files"
        return gate.refusal(int8.get("figures") or {}, self.thresholds())

    def thresholds(self) -> gate.Thresholds:
        launch = self.settings.launch
        return gate.Thresholds(launch.int8_min_mean_cosine, launch.int8_min_cosine)

    def bf16_check(
        self, export_dir: Path, deadline: float
    ) -> tuple[str | None, dict[str, Any], str | None]:
        """(OpenVINO version, BF16 vs FP32 figures, refusal or None) for an export."""
        thresholds = self.thresholds()
        version: str | None = None
        measured: dict[str, Any] = {}
        refused: str | None = None
        if (unit := bf16.bf16_flag(bf16.cpu_flags())) is None:
            refused = ("this CPU has no BF16 units (neither of "
                       f"{', '.join(bf16.BF16_FLAGS)} in /proc/cpuinfo's flags)")  # fmt: skip
        else:
            install = TritonInstall.discover()
            python = (install.python_bin_dir or Path("/usr/bin")) / "python3"
            script = default_templates() / "python" / "bf16_check.py"
            self.progress(f"cpu-bf16: {unit}; checking OpenVINO BF16 against FP32")
            try:
                threads = plan.model_plan("cpu-bf16", plan.usable_cpus()).threads
                version, measured = bf16.figures(
                    export_dir, python, script, threads,
                    timeout=max(1.0, min(bf16.CHECK_SECONDS, deadline - time.monotonic())),
                    stop=self.stop_requested.is_set,
                )  # fmt: skip
                refused = bf16.refusal(measured, thresholds)
            except bf16.Bf16Unavailable as exc:
                refused = str(exc)
        return version, measured, refused

    def auto_cpu(
        self, export_dir: Path, identity: str, repository: RepositorySettings
    ) -> tuple[Path, Profile, str]:
        """``auto`` without a GPU, at start: the export to serve, the profile and why. The
        choice recorded for this machine; else (``reloadable`` set: the first start here) what
        serves until the background measurement has chosen."""
        recorded = self.recorded_cpu_choice(export_dir, identity, repository)
        if recorded is None:
            self.reloadable = True
            return export_dir, *self.provisional_cpu(export_dir)
        profile, reason = recorded
        if profile == "cpu-int8":  # a new cache volume, or the export made again
            export_dir = served_export.find_or_export(self.settings.launch, self.progress,
                                                self.stop_requested, int8=True)  # fmt: skip
        return export_dir, profile, reason

    def provisional_cpu(self, export_dir: Path) -> tuple[Profile, str]:
        """``auto``'s first start on this CPU: what serves at once while the candidates are
        built and timed, the export's INT8 files if it has them and they pass the gate, else
        FP32."""
        int8 = json.loads((export_dir / "manifest.json").read_text()).get("int8") or {}
        refused = self.int8_refusal(int8)
        later = "while the CPU profiles are built and timed in the background"
        if refused is None:
            return "cpu-int8", f"auto, first start here: the export's INT8 files serve {later}"
        if not int8.get("files"):
            return "cpu", f"auto, first start here: FP32 serves {later}"
        return "cpu", f"auto, first start here: FP32 serves ({refused}) {later}"

    def measure_and_switch(
        self,
        export_dir: Path,
        identity: str,
        repository: RepositorySettings,
        serving: Profile,
        choose: bool = True,
    ) -> None:
        """After ready: time the CPU profiles (``choose``: ``auto``'s first start here), then
        the chosen profile's core plans where none is recorded for this machine, then load the
        result into the serving Triton in place (the configs carry the figures for
        /v1/models)."""
        launch = self.settings.launch
        deadline = time.monotonic() + launch.startup_timeout_s
        profile, reason = serving, "as configured"
        try:
            if choose:
                # cpu-int8's files, quantized now if the export has none yet (as at a fresh
                # start)
                served_export.find_or_export(launch, self.progress, self.stop_requested,
                                             int8=True)  # fmt: skip
                profile, reason = self.measure_cpu(export_dir, identity, repository, deadline)
                if profile == "cpu-bf16":
                    profile, reason = self.bf16_gate(export_dir, reason, deadline)
                if profile == "cpu-int8-openvino":
                    self.int8_openvino_gate(export_dir, repository.cpu_backend, deadline)
            assert self.planner is not None
            if self.planner.settle(self.served(profile), launch.plan_measure_s > 0):
                self.measure_plan(export_dir, repository, self.served(profile), deadline)
            if self.stop_requested.is_set():
                return
            self.switch_to(repository.model_copy(update={"profile": profile}), export_dir,
                           deadline)  # fmt: skip
        except Interrupted:
            return
        except Exception:  # whatever failed, what serves goes on serving
            log.exception("timing the CPU profiles or their plans, or loading the choice, "
                          "failed; %s goes on serving", serving)  # fmt: skip
            return
        planned = self.planner.describe(self.served(profile))
        if choose:
            change = "stays" if profile == serving else f"replaces {serving}"
            self.progress(f"auto: Triton {profile} profile ({reason}; {planned}) {change}, "
                          "loaded in place")  # fmt: skip
        else:
            self.progress(f"Triton {profile} profile: {planned}, loaded in place")

    def measure_plan(
        self, export_dir: Path, repository: RepositorySettings, profile: Profile, deadline: float
    ) -> None:
        """Time ``profile``'s candidate core plans within ``plan_measure_s`` (once per machine:
        the choice is kept) and make the rule's choice the one rendered from now on."""
        assert self.planner is not None
        budget = min(self.settings.launch.plan_measure_s, deadline - time.monotonic())
        names = ", ".join(p.name for p in plan.plan_candidates(self.planner.cpus))
        self.progress(f"core plan: timing {profile} as {names} (instances x threads) through "
                      f"Triton on this machine (at most {budget:.0f} s, once)")  # fmt: skip
        settings = Settings(self.settings.server, repository, self.settings.launch)
        timer = self.plan_timer or functools.partial(
            core_plan.time_plan, export_dir=export_dir, settings=settings,
            stop=self.stop_requested)  # fmt: skip
        self.planner.measure(profile, functools.partial(timer, profile), budget)

    def served(self, profile: Profile) -> Profile:
        """What a CPU profile serves: ``cpu`` where BF16 was refused and FP32 falls back."""
        fallback = profile == "cpu-bf16" and self.bf16 is not None and self.bf16.get("fallback")
        return "cpu" if fallback else profile

    def make_planner(self, export_dir: Path, repository: RepositorySettings) -> core_plan.Planner:
        """The CPU profiles' model plan for this machine, model and runtimes (recorded beside
        the export, as the profile choice)."""
        machine, records = self.cpu_signature(self.identity, repository, export_dir)
        base = {k: v for k, v in machine.items() if k not in ("gate", "plans")}
        records = [record.with_name(core_plan.RECORD) for record in records]
        return core_plan.Planner(repository.instance_count, repository.cpu_threads,
                                 plan.usable_cpus(), base, records)  # fmt: skip

    def switch_to(self, repository: RepositorySettings, export_dir: Path, deadline: float) -> None:
        """Render ``repository.profile`` beside the live repository, put each model's directory
        in place of the served one and have Triton load it again: the old version serves until
        the new one is READY. One that does not load is put back (the old one still serves)."""
        assert self.triton is not None and self.scratch is not None
        staged = self.render_profile(repository, export_dir, self.scratch / "staged")
        live = self.triton.repository
        try:
            for name in (TRITON_MODEL_NAME, TEXT_MODEL_NAME):
                if not (staged / name).is_dir():
                    continue
                replaced = self.scratch / f"replaced-{name}"
                _point_at(staged / name, live / name)
                (live / name).rename(replaced)
                (staged / name).rename(live / name)
                try:
                    self.triton.reload(name, timeout=max(1.0, deadline - time.monotonic()))
                except BaseException:
                    shutil.rmtree(live / name)
                    replaced.rename(live / name)
                    raise
                shutil.rmtree(replaced)
        finally:
            shutil.rmtree(staged, ignore_errors=True)

    def recorded_cpu_choice(
        self, export_dir: Path, identity: str, repository: RepositorySettings
    ) -> tuple[Profile, str] | None:
        """``auto`` without a GPU: the choice recorded for this machine and model, if any."""
        signature, records = self.cpu_signature(identity, repository, export_dir)
        for record in records:
            if (choice := cpu_auto.recorded(record, signature)) is not None:
                self.profile_choice = choice.section(f"measured here earlier ({record})")
                return choice.profile, f"auto, measured here earlier: {choice.reason}"
        return None

    def measure_cpu(
        self, export_dir: Path, identity: str, repository: RepositorySettings, deadline: float
    ) -> tuple[Profile, str]:
        """``auto`` without a GPU: the choice recorded for this machine and model, else the
        fastest CPU profile that passes the gate, timed now within ``auto_measure_s``."""
        if (recorded := self.recorded_cpu_choice(export_dir, identity, repository)) is not None:
            return recorded
        signature, records = self.cpu_signature(identity, repository, export_dir)
        candidates = self.cpu_candidates(export_dir, repository.cpu_backend, bf16.cpu_flags(),
                                         deadline)  # fmt: skip
        budget = min(self.settings.launch.auto_measure_s, deadline - time.monotonic())
        self.progress(f"auto: timing {', '.join(p for p, w in candidates.items() if w is None)} "
                      "through Triton on this machine, each at its best core plan (at most "
                      f"{budget:.0f} s, once)")  # fmt: skip
        choice = cpu_auto.measure(candidates, self.cpu_timer or self.triton_timer(
            export_dir, repository), signature, budget_s=budget)  # fmt: skip
        kept = cpu_auto.keep(choice, records)
        self.profile_choice = choice.section(f"measured now (kept in {kept})")
        if choice.profile != "cpu-bf16":
            self.bf16 = None  # measured as a candidate; not what serves
        return choice.profile, f"auto, measured now in {choice.seconds:.0f} s: {choice.reason}"

    def cpu_signature(
        self, identity: str, repository: RepositorySettings, export_dir: Path
    ) -> tuple[dict[str, Any], list[Path]]:
        """What a recorded CPU choice is valid for, and where it is kept."""
        runtimes = dict(self.runtimes(repository.cpu_backend))
        flags = bf16.cpu_flags()
        # the gate's thresholds too: a stricter gate may refuse what was chosen
        cpus = plan.usable_cpus()
        plans: dict[str, tuple[int, int] | str] = {}
        for profile in cpu_auto.CANDIDATES:
            fixed = plan.model_plan(profile, cpus, repository.instance_count,
                                    repository.cpu_threads)  # fmt: skip
            measured = self.settings.launch.plan_measure_s > 0 and not (
                repository.instance_count or repository.cpu_threads
            )
            plans[profile] = "measured here" if measured else (fixed.instances, fixed.threads)
        signature = cpu_auto.signature(cpu=cpu_auto.cpu_model(), flags=flags, cpus=cpus,
                                       runtimes=runtimes, backend=repository.cpu_backend,
                                       model=identity, gate=self.thresholds().as_dict(),
                                       plans=plans)  # fmt: skip
        # beside the export (the model cache); a read-only baked export: the cache volume
        records = [export_dir / cpu_auto.RECORD,
                   Path(repository.trt_cache_path) / cpu_auto.RECORD]  # fmt: skip
        return signature, records

    def runtimes(self, cpu_backend: str) -> dict[str, str]:
        """The CPU runtimes' versions in the Triton env (and the native backend's), read once."""
        if cpu_backend in self.runtimes_read:
            return self.runtimes_read[cpu_backend]
        install = TritonInstall.discover()
        python = (install.python_bin_dir or Path("/usr/bin")) / "python3"
        runtimes = cpu_auto.runtime_versions(python)
        if cpu_backend == "onnxruntime":
            runtimes["onnxruntime-backend"] = engines.runtime_versions(install.backend_dir)[1]
        self.runtimes_read[cpu_backend] = runtimes
        return runtimes

    def cpu_candidates(
        self, export_dir: Path, cpu_backend: str, flags: frozenset[str], deadline: float
    ) -> dict[Profile, str | None]:
        """Each CPU profile ``auto`` may serve here, with why it may not (None: it may)."""
        manifest = json.loads((export_dir / "manifest.json").read_text())
        found: dict[Profile, str | None] = dict.fromkeys(cpu_auto.CANDIDATES)
        found["cpu-int8"] = self.int8_refusal(manifest.get("int8") or {})
        if bf16.auto_unit(cpu_backend, flags) is None:
            found["cpu-bf16"] = (
                "OpenVINO runs in the Python backend only" if bf16.bf16_flag(flags)
                else "this CPU has no BF16 units"
            )  # fmt: skip
        else:
            version, measured, refused = self.bf16_check(export_dir, deadline)
            found["cpu-bf16"] = refused
            if refused is None:
                self.bf16 = bf16.section(version, measured, self.thresholds(), None)
        # last of the builds: the longest (NNCF), so a tight start-up budget cuts it, not the
        # others
        found["cpu-int8-openvino"] = self.int8_openvino_check(export_dir, cpu_backend, deadline)
        return found

    def triton_timer(self, export_dir: Path, repository: RepositorySettings) -> cpu_auto.Timer:
        """Times a CPU profile as it would serve, each plan in a Triton of its own, batches of
        32 from several callers: at its best plan, its candidate plans measured now where none
        is recorded or set (launcher/core_plan.py ``Planner.race``)."""
        if self.planner is None:
            self.planner = self.make_planner(export_dir, repository)
        planner = self.planner
        settings = Settings(self.settings.server, repository, self.settings.launch)
        measuring = self.settings.launch.plan_measure_s > 0

        def timer(profile: Profile, budget: float) -> list[float]:
            one = self.plan_timer or functools.partial(
                core_plan.time_plan, export_dir=export_dir, settings=settings,
                stop=self.stop_requested)  # fmt: skip
            return planner.race(profile, functools.partial(one, profile), budget, measuring)

        return timer

    def choose_profile(
        self,
        export_dir: Path,
        gpu: profiles.GpuInfo | None,
        identity: str,
        repository: RepositorySettings,
        deadline: float,
    ) -> tuple[Profile, str]:
        """The profile to serve, and why; calibration (opt-in) measures within the start-up
        budget with the engine cache serving will use, so its TensorRT build is not wasted."""
        settings = Settings(self.settings.server, repository, self.settings.launch)
        server = self.settings.server
        workers = plan.plan_for(self.planned_workers(), server.decode_threads,
                                server.max_decode_mib, figures=plan.GPU_FIGURES)  # fmt: skip
        # several requests in flight per worker, as under load
        callers = max(4, 4 * workers.workers)

        def timer(profile: Profile, budget: float) -> list[float]:
            return calibrate.measure(profile, export_dir, settings, self.stop_requested,
                                     budget_s=budget, callers=callers)  # fmt: skip

        return profiles.choose(
            repository.profile,
            gpu,
            model=identity,
            record=Path(repository.trt_cache_path) / engines.CALIBRATION_NAME,
            calibrate_now=self.settings.launch.calibrate,
            timer=timer,
            deadline=deadline,
            bf16_unit=(
                bf16.auto_unit(repository.cpu_backend, bf16.cpu_flags()) if gpu is None else None
            ),
        )

    def planned_workers(self) -> int:
        """GATEWAY_WORKERS where it was set (its default, 1, is for the HTTP process run by
        hand), else 0: the launcher plans them."""
        server = self.settings.server
        return server.workers if "workers" in server.model_fields_set else 0

    def gateway_process(self, export_dir: Path, profile: Profile) -> GatewayProcess:
        assert self.triton is not None and self.scratch is not None
        server, launch = self.settings.server, self.settings.launch
        figures = (self.planner.figures(self.served(profile))
                   if self.planner is not None and profile in CPU_PROFILES
                   else plan.GPU_FIGURES)  # fmt: skip
        workers = plan.plan_for(self.planned_workers(), server.decode_threads,
                                server.max_decode_mib, figures=figures)  # fmt: skip
        if self.planned_workers() or server.decode_threads:
            self.worker_reason = "as configured"
        else:
            cpus = plan.usable_cpus()
            shared = f"; the model's threads span all {cpus}" if profile in CPU_PROFILES else ""
            self.worker_reason = (f"planned: {figures.gateway_us:.0f} us of gateway CPU per "
                                  f"image against {figures.model_us:.0f} us of the model's "
                                  f"({figures.source}), {cpus - workers.triton_cores} of {cpus} "
                                  f"cores the gateway's{shared}")  # fmt: skip
        env = {
            "GATEWAY_WORKERS": str(workers.workers),
            "GATEWAY_DECODE_THREADS": str(workers.decode_threads),
            "GATEWAY_TRITON_METRICS_URL": self.triton.metrics_url,
        }
        manifest = json.loads((export_dir / "manifest.json").read_text())
        if "model_id" not in server.model_fields_set:
            # the public id names the model served (CLIP_MODEL), unless GATEWAY_MODEL_ID is set
            env["GATEWAY_MODEL_ID"] = manifest["model"]
        if server.immich:
            env["GATEWAY_IMMICH"] = "true"  # --immich reaches the HTTP process too
            if "immich_name" not in server.model_fields_set:
                env["GATEWAY_IMMICH_NAME"] = immich_name(manifest) or ""
            if server.immich_upstream:  # --immich-upstream reaches it too
                env["GATEWAY_IMMICH_UPSTREAM"] = ",".join(server.immich_upstream)
        if "decode_speed_record" not in server.model_fields_set:
            # the decode speed measured at the gateway's first start here, kept in the cache
            # volume beside the engines and the CPU profile choice (the user's cache otherwise)
            env["GATEWAY_DECODE_SPEED_RECORD"] = str(
                Path(self.settings.repository.trt_cache_path) / decode_speed.RECORD
            )
        if workers.workers > 1:
            # each worker counts for itself; prometheus-client sums them through files here
            metrics_dir = self.scratch / "metrics"
            metrics_dir.mkdir(mode=0o700)
            env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
        return GatewayProcess(
            self.triton.grpc_url,
            env=env,
            host=server.host,
            port=server.port,
            inherit_output=launch.log_file is None,
            log_path=launch.log_file,
            stop_requested=self.stop_requested,
        )

    def supervise(self) -> int:
        """Wait for a stop signal (OK) or for either child to exit (FAILED)."""
        while not self.stop_requested.wait(0.5):
            if self._a_child_died():
                return FAILED
        delay = self.settings.launch.stop_delay_s
        if delay > 0 and not self.hurry.is_set():
            self._stopping(f"still serving for {delay:g} s while endpoints let go; again: now")
            until = time.monotonic() + delay
            while not self.hurry.wait(max(0.0, min(0.5, until - time.monotonic()))):
                if self._a_child_died():
                    return FAILED
                if time.monotonic() >= until:
                    break
        self._stopping("draining in-flight requests, then stopping Triton")
        return OK

    def _a_child_died(self) -> bool:
        for name, child in (("tritonserver", self.triton), ("gateway", self.gateway)):
            process = child.process if child is not None else None
            if process is None or process.poll() is not None:
                code = None if process is None else process.returncode
                log.error("%s exited (code %s); stopping the other", name, code)
                return True
        return False

    def _stopping(self, what: str) -> None:
        name = signal.Signals(self.stop_signal).name if self.stop_signal else "stop"
        self.progress(f"{name}: stopping ({what})")

    def stop_triton(self) -> None:
        """READY: Triton gets its grace to finish and unload. Not READY: nothing is in flight
        and a model load or engine build is not worth waiting for (timings.py)."""
        if self.triton is None:
            return
        ready = self.triton_ready
        self.triton.stop(
            grace=self.settings.launch.triton_grace_s if ready else timings.TRITON_STARTUP_GRACE_S
        )
        self.triton.release_ports()
        self.triton = None
        self.triton_ready = False

    def shutdown(self) -> None:
        """Gateway first (it stops accepting and drains its in-flight requests, then removes
        its shared-memory regions), then Triton (and its backend stubs), then scratch. A
        measurement still under way in the background sees the stop and ends first."""
        if self.switcher is not None:
            self.switcher.join(timeout=timings.TRITON_STARTUP_GRACE_S + 5)
            self.switcher = None
        if self.gateway is not None:
            self.gateway.stop(grace=self.timings.gateway_stop_s)
            self.gateway = None
        self.stop_triton()
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None


def _point_at(staged: Path, live: Path) -> None:
    """A staged model's config names files beside it by absolute path (the tokenizer the
    gateway loads): make those the paths it will have once moved to ``live``."""
    config = staged / "config.pbtxt"
    config.write_text(config.read_text().replace(f"{staged.absolute()}/", f"{live.absolute()}/"))


def main() -> int:
    """The container entrypoint: settings from the environment, logs to stdout/stderr."""
    settings = Settings.from_env()
    configure(settings.server.log_level, settings.server.log_format)
    return Supervisor(settings).run()


if __name__ == "__main__":
    sys.exit(main())
