"""The launcher's processes as the profiles see them (clip_gateway/profiles/host.py ``Host``):
the export (launcher/served_export.py), a tritonserver of its own for each timing (launcher/
local.py, its repository rendered by launcher/repository.py) and the Triton env, found once; and
the serving tritonserver the supervisor starts, made the same way."""

from __future__ import annotations

import functools
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from clip_gateway.config.settings import RepositorySettings, Settings
from clip_gateway.launcher import served_export
from clip_gateway.launcher.local import (
    SYSTEM_BIN,
    LocalTriton,
    TritonInstall,
    otel_trace_args,
    otlp_traces_url,
)
from clip_gateway.launcher.repository import default_templates, render
from clip_gateway.model.contract import TEXT_MODEL_NAME
from clip_gateway.profiles.engines import BuildLock


class TritonHost:
    def __init__(
        self, settings: Settings, progress: Callable[[str], None], stop: threading.Event
    ) -> None:
        self.settings = settings
        self.say = progress
        self.stop = stop
        #: the serving Triton may load its models again (what is measured after ready)
        self.reloadable = False

    def progress(self, line: str) -> None:
        self.say(line)

    def export(self, *, int8: bool) -> Path:
        return served_export.find_or_export(self.settings.launch, self.progress, self.stop,
                                            int8=int8)  # fmt: skip

    @functools.cached_property
    def install(self) -> TritonInstall:
        return TritonInstall.discover()

    def python(self) -> Path:
        return (self.install.python_bin_dir or SYSTEM_BIN) / "python3"

    def backend_dir(self) -> Path:
        return self.install.backend_dir

    def script(self, name: str) -> Path:
        return default_templates() / "python" / name

    def triton(self, rendered: Path, *, serving: bool = False) -> LocalTriton:
        """A tritonserver on ``rendered``, its log where the gateway's goes (GATEWAY_LOG_FILE);
        ``serving``: on the configured ports, its traces exported where OTEL_EXPORTER_OTLP_*
        says, reloadable where something is measured after ready (else loopback ports of its
        own: a trial's)."""
        launch = self.settings.launch
        traces = otlp_traces_url() if serving else None
        return LocalTriton(
            rendered,
            install=self.install,
            grpc_port=launch.triton_grpc_port if serving else 0,
            http_port=launch.triton_http_port if serving else 0,
            metrics_port=launch.triton_metrics_port if serving else 0,
            extra_args=otel_trace_args(traces) if traces else (),
            inherit_output=launch.log_file is None,
            log_path=launch.log_file,
            stop_requested=self.stop,
            reloadable=serving and self.reloadable,
        )

    @contextmanager
    def trial(
        self, repository: RepositorySettings, export_dir: Path, timeout: float, *,
        image_only: bool = False,
    ) -> Iterator[str]:  # fmt: skip
        deadline = time.monotonic() + timeout
        with tempfile.TemporaryDirectory(prefix="clip-gateway-trial-") as scratch:
            rendered = render(repository, export_dir, Path(scratch) / "model_repository")
            if image_only:
                shutil.rmtree(rendered / TEXT_MODEL_NAME, ignore_errors=True)
            triton = self.triton(rendered)
            # the engines it builds are serving's (same cache directory): built under the same lock
            lock = BuildLock(Path(repository.trt_cache_path), self.stop)
            if repository.profile == "tensorrt":
                lock.acquire(timeout=timeout)
            built = False
            try:  # a start that fails or is interrupted leaves a process to stop too
                triton.start(timeout=deadline - time.monotonic())
                built = True
                yield triton.grpc_url
            finally:
                triton.stop()
                triton.release_ports()
                lock.release(completed=built)
