"""The one launch path: ``make serve``, ``clip-gateway serve`` and the container entrypoint.

1. the model: a baked export directory, or the export cache (built by ``python -m export`` in a
   child process on first use: torch never enters this process or the server's);
2. the Triton profile: named, or chosen for the GPU found (runtime/profiles.py);
3. the model repository, rendered into a private scratch directory;
4. tritonserver on loopback, READY (TensorRT engine builds included) within the start-up budget;
5. the gateway's HTTP process on the public socket, bound here, with the worker plan;
6. supervision: SIGTERM, SIGINT or SIGHUP, or either child dying, ends it: the gateway stops
   accepting and drains, then Triton stops, then the scratch directory goes. A signal during
   start-up stops at once. Children get SIGTERM by themselves if this process is killed.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from gateway.backend.local import LocalTriton, otel_trace_args, otlp_traces_url
from gateway.backend.repository import render
from gateway.observability.logs import configure
from gateway.runtime import calibrate, plan, profiles
from gateway.runtime.processes import GatewayProcess, Interrupted, ProcessStartError
from gateway.runtime.settings import PROFILES, Profile, Settings

log = logging.getLogger("gateway.supervisor")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: Exit codes: stopped on request, a child failed, the configuration cannot work.
OK, FAILED, MISCONFIGURED = 0, 1, 2


class LaunchError(RuntimeError):
    """Start-up cannot go on (missing weights, no export tooling); the message says why."""


class Supervisor:
    def __init__(self, settings: Settings, progress: Callable[[str], None] | None = None) -> None:
        self.settings = settings
        self.progress = progress or (lambda line: log.info("%s", line))
        self.stop_requested = threading.Event()
        self.stop_signal: int | None = None
        self.triton: LocalTriton | None = None
        self.gateway: GatewayProcess | None = None
        self.scratch: Path | None = None

    def request_stop(self, signum: int, _frame: FrameType | None = None) -> None:
        # only flags here: printing from a signal handler can re-enter a stream's write
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

    def start(self) -> None:
        launch = self.settings.launch
        started = time.monotonic()
        export_dir = self.model_directory()
        profile, reason = self.choose_profile(export_dir)
        self.scratch = Path(tempfile.mkdtemp(prefix="clip-gateway-", dir=launch.scratch_dir))
        repository = render(
            self.settings.repository.model_copy(update={"profile": profile}),
            export_dir,
            self.scratch / "model_repository",
        )
        traces = otlp_traces_url()
        self.triton = LocalTriton(
            repository,
            grpc_port=launch.triton_grpc_port,
            http_port=launch.triton_http_port,
            metrics_port=launch.triton_metrics_port,
            extra_args=otel_trace_args(traces) if traces else (),
            inherit_output=launch.log_file is None,
            log_path=launch.log_file,
            stop_requested=self.stop_requested,
        )
        budget = launch.startup_timeout_s - (time.monotonic() - started)
        self.triton.start(timeout=budget)
        self.progress(
            f"Triton {profile} profile ({reason}) READY in {self.triton.ready_seconds:.1f} s"
        )
        self.gateway = gateway = self.gateway_process(export_dir)
        budget = launch.startup_timeout_s - (time.monotonic() - started)
        gateway.start(timeout=budget)
        gateway.wait_ready(timeout=budget)
        workers, threads = gateway.env["GATEWAY_WORKERS"], gateway.env["GATEWAY_DECODE_THREADS"]
        self.progress(
            f"ready on {gateway.url} ({workers} worker(s) x {threads} decode threads); "
            "API docs at /docs"
        )

    def model_directory(self) -> Path:
        """The export to serve: the configured directory, or the cache entry for model +
        weights, exported first if missing (in a child process: it imports torch)."""
        launch = self.settings.launch
        if launch.model_dir is not None:
            if not (launch.model_dir / "manifest.json").is_file():
                raise LaunchError(f"{launch.model_dir} is not an export (no manifest.json)")
            return launch.model_dir
        from export.spec import (
            WeightsUnavailableError,
            cache_entry,
            default_cache_dir,
            weights_from_spec,
        )

        cache = launch.cache_dir or default_cache_dir()
        try:
            weights = weights_from_spec(launch.weights)
            entry = cache_entry(launch.model, weights, cache)
        except WeightsUnavailableError as exc:
            raise LaunchError(str(exc)) from exc
        if (entry / "manifest.json").is_file():
            self.progress(f"model {launch.model} ({weights.describe()}) from {entry}")
            return entry
        self.progress(f"exporting {launch.model} ({weights.describe()}) to ONNX, once...")
        started = time.monotonic()
        self._export(cache)
        self.progress(f"exported in {time.monotonic() - started:.0f} s into {entry}")
        return entry

    def _export(self, cache: Path) -> None:
        launch = self.settings.launch
        command = [sys.executable, "-m", "export", "--model", launch.model, "--weights",
                   launch.weights, "--cache-dir", str(cache), "--print-dir"]  # fmt: skip
        # the exporter's chatter (hundreds of lines) goes to a file, never to the terminal
        with tempfile.TemporaryFile() as output:
            child = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
            while child.poll() is None:
                if self.stop_requested.wait(0.2):
                    child.terminate()
                    child.wait()
                    raise Interrupted("stop requested during the export")
            output.seek(0)
            text = output.read().decode(errors="replace")
        if launch.log_file is not None:
            with open(launch.log_file, "a") as log_file:
                log_file.write(text)
        if child.returncode != 0:
            detail = text.strip().splitlines()[-12:] or ["(no output)"]
            if "No module named" in text:
                detail.append("the exporter needs: pip install 'clip-gateway[export]'")
            raise LaunchError("the model export failed:\n  " + "\n  ".join(detail))

    def choose_profile(self, export_dir: Path) -> tuple[Profile, str]:
        repository = self.settings.repository
        found = profiles.detect() if repository.profile == "auto" else None
        if found is not None:
            log.info("GPU: %s, compute capability %s, %.0f GiB", found.name,
                     found.compute_capability, found.memory_gib)  # fmt: skip
        record = Path(repository.trt_cache_path) / "calibration.json"

        def timer(profile: Profile) -> dict[str, float]:
            return calibrate.measure(profile, export_dir, self.settings, self.stop_requested)

        return profiles.choose(
            repository.profile,
            found,
            model=export_dir.resolve().name,
            record=record,
            calibrate_now=self.settings.launch.calibrate,
            timer=timer,
        )

    def gateway_process(self, export_dir: Path) -> GatewayProcess:
        assert self.triton is not None and self.scratch is not None
        server, launch = self.settings.server, self.settings.launch
        workers = plan.worker_plan(plan.usable_cpus(), server.workers, server.decode_threads)
        env = {
            "GATEWAY_WORKERS": str(workers.workers),
            "GATEWAY_DECODE_THREADS": str(workers.decode_threads),
            "GATEWAY_TRITON_METRICS_URL": self.triton.metrics_url,
        }
        if "model_id" not in server.model_fields_set:
            # the public id names the model served (CLIP_MODEL), unless GATEWAY_MODEL_ID is set
            manifest = json.loads((export_dir / "manifest.json").read_text())
            env["GATEWAY_MODEL_ID"] = manifest["model"]
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
            for name, child in (("tritonserver", self.triton), ("gateway", self.gateway)):
                process = child.process if child is not None else None
                if process is None or process.poll() is not None:
                    code = None if process is None else process.returncode
                    log.error("%s exited (code %s); stopping the other", name, code)
                    return FAILED
        self._stopping("draining in-flight requests, then stopping Triton")
        return OK

    def _stopping(self, what: str) -> None:
        name = signal.Signals(self.stop_signal).name if self.stop_signal else "stop"
        self.progress(f"{name}: stopping ({what})")

    def shutdown(self) -> None:
        """Gateway first (it stops accepting and drains its in-flight requests, then removes
        its shared-memory regions), then Triton (and its backend stubs), then scratch."""
        server, launch = self.settings.server, self.settings.launch
        if self.gateway is not None:
            self.gateway.stop(grace=server.drain_s + 5)
            self.gateway = None
        if self.triton is not None:
            self.triton.stop(grace=launch.triton_grace_s)
            self.triton.release_ports()
            self.triton = None
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None


def serve(argv: list[str] | None = None) -> int:
    """``clip-gateway serve`` / ``make serve``: interactive, quiet, logs to a file."""
    parser = argparse.ArgumentParser(
        prog="clip-gateway serve",
        description="Export the model if needed, start Triton and the gateway in the foreground.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on")
    parser.add_argument("--model", default="ViT-B-32", help="open_clip model name")
    parser.add_argument(
        "--weights",
        default="laion2b_s34b_b79k",
        help="open_clip pretrained tag, a checkpoint path, or 'random' (tests, benchmarks)",
    )
    parser.add_argument(
        "--profile", default="cpu", choices=["auto", *PROFILES], help="Triton profile"
    )
    parser.add_argument("--cache-dir", type=Path, default=None, help="export cache directory")
    parser.add_argument(
        "--log-file", type=Path, default=None,
        help="where Triton's and the gateway's logs go (default: <cache>/logs/serve.log)",
    )  # fmt: skip
    parser.add_argument("-v", "--verbose", action="store_true", help="all logs on the terminal")
    args = parser.parse_args(argv)
    log_file = None
    if not args.verbose:
        from export.spec import default_cache_dir

        log_file = args.log_file or (args.cache_dir or default_cache_dir()) / "logs" / "serve.log"
        log_file.parent.mkdir(parents=True, exist_ok=True)
    settings = Settings.from_env(
        server={"host": args.host, "port": args.port},
        repository={"profile": args.profile},
        launch={
            "model": args.model,
            "weights": args.weights,
            "cache_dir": args.cache_dir,
            "log_file": log_file,
        },
    )
    configure("INFO" if args.verbose else "WARNING", "text")
    if log_file is not None:
        print(f"clip-gateway: logs in {log_file}", flush=True)

    def progress(line: str) -> None:
        print(f"clip-gateway: {line}", flush=True)

    code = Supervisor(settings, progress).run()
    progress("stopped" if code == OK else f"exited with code {code}")
    return code


def main() -> int:
    """The container entrypoint: settings from the environment, logs to stdout/stderr."""
    settings = Settings.from_env()
    configure(settings.server.log_level, settings.server.log_format)
    return Supervisor(settings).run()


if __name__ == "__main__":
    sys.exit(main())
