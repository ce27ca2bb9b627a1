"""The one launch path: ``make serve``, ``clip-gateway serve`` and the container entrypoint. It
starts, supervises and stops processes; what they serve is the profiles' answer
(clip_gateway/profiles/choice.py: the export, the profile, its core plan).

1. what to serve here, asked once (the export made in a child process on first use: torch never
   enters this process or the server's);
2. its model repository, rendered into a private scratch directory; tritonserver on loopback,
   READY (TensorRT engine builds included) within the start-up budget, or what the profiles
   give in place of an automatic choice that does not load (tensorrt → cuda);
3. the gateway's HTTP process on the public socket, bound here, with the worker plan
   (launcher/gateway.py);
4. where something is measured after ready (``auto``'s first start on a CPU host, a core plan),
   its answer loaded into the serving Triton in place (Triton's reload: no request fails);
5. supervision: SIGTERM, SIGINT or SIGHUP, or either child dying, ends it: after the stop delay
   (still serving, while endpoints and load balancers let go) the gateway stops accepting and
   drains, then Triton stops, then the scratch directory goes. A signal during start-up stops
   at once: nothing is in flight, so a model load or engine build is abandoned (Triton gets a
   short grace, then SIGKILL) and half-built engines are removed. A second signal skips the
   stop delay. Children get SIGTERM by themselves if this process is killed.
Every bound comes from config/timings.py.
"""

from __future__ import annotations

import logging
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from clip_gateway.config import timings
from clip_gateway.config.processes import (
    GatewayProcess,
    Interrupted,
    LaunchError,
    ProcessStartError,
)
from clip_gateway.config.settings import Settings, exposure_problem, immich_protection
from clip_gateway.imaging import paths
from clip_gateway.launcher import served_export
from clip_gateway.launcher.gateway import gateway_for
from clip_gateway.launcher.host import TritonHost
from clip_gateway.launcher.local import LocalTriton
from clip_gateway.launcher.repository import render, rendered_config
from clip_gateway.model.contract import TEXT_MODEL_NAME, TRITON_MODEL_NAME
from clip_gateway.observability.logs import configure
from clip_gateway.profiles import cpu_auto
from clip_gateway.profiles.choice import Selection, Serving
from clip_gateway.profiles.engines import BuildLock
from clip_gateway.profiles.planner import ProfileTimer

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
        plan_timer: ProfileTimer | None = None,
    ) -> None:
        self.settings = settings
        self.progress = progress or (lambda line: log.info("%s", line))
        self.timings = timings.derive(settings)
        self.stop_requested = threading.Event()
        #: a second stop signal: skip the stop delay
        self.hurry = threading.Event()
        self.stop_signal: int | None = None
        self.host = TritonHost(settings, lambda line: self.progress(line), self.stop_requested)
        #: what to serve here (clip_gateway/profiles): asked at start, and after ready where
        #: something is still to be measured (``cpu_timer``, ``plan_timer``: its timings' seams)
        self.selection = Selection(settings, self.host, cpu_timer=cpu_timer, plan_timer=plan_timer)
        self.triton: LocalTriton | None = None
        self.triton_ready = False
        self.gateway: GatewayProcess | None = None
        self.scratch: Path | None = None
        self.switcher: threading.Thread | None = None
        #: how the gateway's workers were planned, for the ready line
        self.worker_reason = ""

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
        server = self.settings.server
        if (exposure := exposure_problem(server)) is not None:
            raise LaunchError(exposure)
        if server.anonymous:
            log.warning("GATEWAY_ANONYMOUS: serving without API keys on %s", server.host)
        if server.immich:
            log.warning("GATEWAY_IMMICH: POST /predict serves Immich, which sends no API key: %s",
                        immich_protection(server))  # fmt: skip
        deadline = time.monotonic() + self.settings.launch.startup_timeout_s
        for problem in self.timings.problems():
            log.warning("%s", problem)
        serving = self.selection.now(deadline)
        self.scratch = Path(tempfile.mkdtemp(prefix="clip-gateway-",
                                             dir=self.settings.launch.scratch_dir))  # fmt: skip
        serving = self.start_model(serving, deadline)
        assert self.triton is not None
        self.progress(f"{serving.line()} READY in {self.triton.ready_seconds:.1f} s")
        gateway, self.worker_reason = gateway_for(self.settings, serving, self.triton,
                                                  self.scratch, self.stop_requested)  # fmt: skip
        self.gateway = gateway
        gateway.start(timeout=deadline - time.monotonic())
        gateway.wait_ready(timeout=deadline - time.monotonic())
        self.say_ready(gateway)
        if serving.later:
            self.switcher = threading.Thread(target=self.switch_later, args=(serving,),
                                             name="auto-measure", daemon=True)  # fmt: skip
            self.switcher.start()

    def say_ready(self, gateway: GatewayProcess) -> None:
        workers, threads = gateway.env["GATEWAY_WORKERS"], gateway.env["GATEWAY_DECODE_THREADS"]
        imaging = paths.current()
        self.progress(
            f"ready on {gateway.url} ({workers} worker(s) x {threads} decode thread(s), "
            f"{self.worker_reason}; resize: "
            f"{imaging.resize}{'' if imaging.simd else ', NOT the SIMD fast path'}); "
            "API docs at /docs"
        )

    def start_model(self, serving: Serving, deadline: float) -> Serving:
        """Triton READY on ``serving``, or on its fallback when its profile was chosen
        automatically and does not load; what runs."""
        while True:
            self.host.reloadable = self.host.reloadable or serving.later
            try:
                self.start_triton(serving, deadline)
                return serving
            except ProcessStartError as exc:
                fallback = None
                if time.monotonic() < deadline:
                    fallback = self.selection.fallback(serving, str(exc), deadline)
                if fallback is None:
                    raise
                serving = fallback

    def start_triton(self, serving: Serving, deadline: float) -> None:
        """Render ``serving`` and start Triton on it, READY before ``deadline``. A TensorRT
        start holds the engine build lock while it may be building."""
        assert self.scratch is not None
        rendered = self.render(serving, self.scratch / "model_repository")
        lock = None
        if serving.repository.profile == "tensorrt":
            lock = BuildLock(Path(serving.repository.trt_cache_path), self.stop_requested)
            try:
                lock.acquire(timeout=deadline - time.monotonic())
            except TimeoutError as exc:
                raise ProcessStartError(str(exc)) from exc
        self.triton_ready = False
        self.triton = self.host.triton(rendered, serving=True)
        try:
            self.triton.start(timeout=deadline - time.monotonic())
            self.triton_ready = True
        except BaseException:
            self.stop_triton()  # before the lock goes: it may still be writing engines
            raise
        finally:
            if lock is not None:
                lock.release(completed=self.triton_ready)

    def render(self, serving: Serving, out_dir: Path) -> Path:
        """``serving`` rendered into ``out_dir``, with what its gates and timings found."""
        rendered = render(serving.repository, serving.export_dir, out_dir, **serving.notes)
        backend = rendered_config(rendered).backend
        if not (self.host.backend_dir() / backend).is_dir():
            raise LaunchError(
                f"the {serving.profile} profile needs Triton's {backend} backend, which "
                f"{self.host.backend_dir()} lacks (GATEWAY_TRITON_CPU_BACKEND chooses the cpu "
                "profile's; GPU profiles need the NGC image)"
            )
        return rendered

    def switch_later(self, serving: Serving) -> None:
        """After ready: what the selection measures in the background (``auto``'s profiles, a
        core plan), loaded into the serving Triton in place (the configs carry the figures for
        /v1/models). Whatever fails, what serves goes on serving."""
        deadline = time.monotonic() + self.settings.launch.startup_timeout_s
        try:
            chosen = self.selection.later(serving, deadline)
            if self.stop_requested.is_set():
                return
            self.switch_to(chosen, deadline)
        except Interrupted:
            return
        except Exception:
            log.exception("timing the CPU profiles or their plans, or loading the choice, "
                          "failed; %s goes on serving", serving.profile)  # fmt: skip
            return
        self.progress(self.selection.loaded(serving, chosen))

    def switch_to(self, serving: Serving, deadline: float) -> None:
        """Render ``serving`` beside the live repository, put each model's directory in place
        of the served one and have Triton load it again: the old version serves until the new
        one is READY. One that does not load is put back (the old one still serves)."""
        assert self.triton is not None and self.scratch is not None
        staged = self.render(serving, self.scratch / "staged")
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
