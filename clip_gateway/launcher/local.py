"""Start and stop a real tritonserver on loopback: the NGC image's, or the one in the PyPI wheel.

The ``nvidia-pytriton`` wheel bundles Triton 2.51 with its Python backend (no onnxruntime backend).
``make`` installs it into ``.triton-env/``, a virtualenv that also holds numpy<2 and onnxruntime:
the Python-backend stub in that wheel silently returns empty output tensors under numpy 2, so the
model code runs in its own interpreter, which the stub finds through ``PATH``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self
from urllib.parse import urlsplit

from clip_gateway.backend.shm import SHM_DIR, alive
from clip_gateway.config.processes import (
    ProcessStartError,
    ReservedPort,
    ServerProcess,
    reserve_port,
)

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_ENV = REPO_ROOT / ".triton-env"
NGC_SERVER = Path("/opt/tritonserver/bin/tritonserver")
SYSTEM_BIN = Path("/usr/bin")
#: The Python backend's shared-memory regions of a Triton started here are named with this
#: prefix, the starting process's pid and a token of the server (``LocalTriton.shm_prefix``), so
#: that the regions of one that died without cleaning up (SIGKILL, a crash: Triton 2.51 can
#: segfault under traced load, docs/OBSERVABILITY.md) can be found and removed. Under its default
#: prefix (``triton_python_backend_shm_region_``) they stayed in /dev/shm, 1 MB or more each,
#: until the machine restarted: a container's /dev/shm fills up with a Triton that keeps dying.
#: Not ``clipgw_``: that is the gateway's own batch regions' (``clipgw_<pid>_…``, backend/shm.py).
SHM_PREFIX = "clipgw-triton_"
_SHM_OWNER = re.compile(rf"^{re.escape(SHM_PREFIX)}(\d+)_[0-9a-f]{{8}}_")


@dataclass(frozen=True)
class TritonInstall:
    """Where a tritonserver binary, its backends and its runtime libraries are."""

    server: Path
    backend_dir: Path
    lib_dirs: tuple[Path, ...] = ()
    #: Prepended to PATH: the Python-backend stub derives its sys.prefix from ``python3`` on PATH.
    python_bin_dir: Path | None = None

    @classmethod
    def discover(cls, env_dir: Path | None = None) -> TritonInstall:
        """``$TRITONSERVER`` / the NGC image's ``/opt/tritonserver`` / the pytriton wheel env."""
        if explicit := os.environ.get("TRITONSERVER"):
            server = Path(explicit)
            return cls(server, server.parents[1] / "backends")
        if NGC_SERVER.exists():
            # the Python backend's stub runs the base image's python3 (the one it was built
            # for, with the base's packages), not the gateway's virtualenv first on PATH
            return cls(NGC_SERVER, NGC_SERVER.parents[1] / "backends", python_bin_dir=SYSTEM_BIN)
        return cls.from_pytriton_env(env_dir or DEFAULT_ENV)

    @classmethod
    def from_pytriton_env(cls, env_dir: Path) -> TritonInstall:
        env_python = env_dir / "bin" / "python3"
        roots = sorted(env_dir.glob("lib/python3*/site-packages/pytriton/tritonserver"))
        if not roots or not env_python.exists():
            raise FileNotFoundError(
                f"no tritonserver found: {env_dir} has no nvidia-pytriton install. "
                "Run `make triton-env` (or set TRITONSERVER to a tritonserver binary)."
            )
        root = roots[0]
        version, libdir = subprocess.run(
            [
                str(env_python),
                "-c",
                "import sys, sysconfig; "
                "print(f'{sys.version_info[0]}.{sys.version_info[1]}'); "
                "print(sysconfig.get_config_var('LIBDIR'))",
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
        _install_stub(root, version)
        # The stub links libpython3.X.so: prefer the env interpreter's own library to the OS one.
        lib_dirs = (root.parent.parent / "nvidia_pytriton.libs", Path(libdir))
        return cls(root / "bin" / "tritonserver", root / "backends", lib_dirs, env_dir / "bin")


def _install_stub(root: Path, python_version: str) -> None:
    stub = root / "python_backend_stubs" / python_version / "triton_python_backend_stub"
    target = root / "backends" / "python" / "triton_python_backend_stub"
    if not stub.exists():
        raise FileNotFoundError(
            f"the pytriton wheel has no Python-backend stub for {python_version}"
        )
    if not target.exists() or target.stat().st_size != stub.stat().st_size:
        shutil.copy2(stub, target)


def otel_trace_args(
    traces_url: str, *, rate: int = 0, service_name: str = "triton", flush_ms: int | None = None
) -> tuple[str, ...]:
    """tritonserver flags exporting OpenTelemetry spans (OTLP/HTTP) to ``traces_url``.

    ``rate=0`` samples nothing by itself: Triton then traces exactly the requests that arrive with
    a W3C traceparent, which the gateway sends only for sampled requests.
    """
    settings = [
        "mode=opentelemetry",
        f"rate={rate}",
        "level=TIMESTAMPS",
        f"opentelemetry,url={traces_url}",
        f"opentelemetry,resource=service.name={service_name}",
    ]
    if flush_ms is not None:
        settings.append(f"opentelemetry,bsp_schedule_delay={flush_ms}")
    return tuple(arg for setting in settings for arg in ("--trace-config", setting))


def otlp_traces_url(environ: dict[str, str] | None = None) -> str | None:
    """The OTLP/HTTP traces URL the OTEL_EXPORTER_OTLP_* variables describe, if any. One that is
    not an http(s) URL (e.g. a compose file's ``${OTEL_EXPORTER_OTLP_ENDPOINT:-}`` passed through
    uninterpolated) is ignored with a warning: given to tritonserver, it aborted Triton at the
    first sampled request."""
    env = os.environ if environ is None else environ
    url = None
    if explicit := env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        url = explicit
    elif base := env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        url = base.rstrip("/") + "/v1/traces"
    if url is None:
        return None
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        log.warning("OTLP endpoint %r is not an http(s) URL: Triton exports no traces", url)
        return None
    return url


@dataclass
class LocalTriton(ServerProcess):
    """A tritonserver child process bound to loopback; use as a context manager.

    ``extra_args`` are more tritonserver flags (e.g. ``otel_trace_args``). With ``reloadable``
    the models may be loaded again from the repository while serving (``reload``: Triton's
    explicit model control, every model loaded at start); otherwise model control stays off and
    the repository is fixed at start. Either way the API listens on loopback only.
    """

    repository: Path
    install: TritonInstall = field(default_factory=TritonInstall.discover)
    host: str = "127.0.0.1"
    grpc_port: int = 0
    http_port: int = 0
    metrics_port: int = 0
    extra_args: tuple[str, ...] = ()
    reloadable: bool = False
    new_session = True
    ready_seconds: float | None = field(default=None, init=False)
    #: Ports reserved for this server (those given as 0); kept across stop/start.
    reservations: list[ReservedPort] = field(default_factory=list, init=False, repr=False)
    #: What the names of its Python backend's shared-memory regions start with (``SHM_PREFIX``).
    shm_prefix: str = field(
        default_factory=lambda: f"{SHM_PREFIX}{os.getpid()}_{secrets.token_hex(4)}_", init=False
    )

    def release_ports(self) -> None:
        """Give back the ports reserved for this server (after its last stop)."""
        for reserved in self.reservations:
            reserved.release()
        self.reservations.clear()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        self.release_ports()

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    def command(self) -> list[str]:
        return [
            str(self.install.server),
            f"--model-repository={self.repository}",
            f"--backend-directory={self.install.backend_dir}",
            f"--grpc-address={self.host}",
            f"--grpc-port={self.grpc_port}",
            f"--http-address={self.host}",
            f"--http-port={self.http_port}",
            f"--metrics-address={self.host}",
            f"--metrics-port={self.metrics_port}",
            *(
                ("--model-control-mode=explicit", "--load-model=*")
                if self.reloadable
                else ("--model-control-mode=none",)
            ),
            "--exit-timeout-secs=10",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
            *self.extra_args,
        ]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        libs = [str(p) for p in self.install.lib_dirs]
        if env.get("LD_LIBRARY_PATH"):
            libs.append(env["LD_LIBRARY_PATH"])
        if libs:
            env["LD_LIBRARY_PATH"] = os.pathsep.join(libs)
        if self.install.python_bin_dir is not None:
            env["PATH"] = f"{self.install.python_bin_dir}{os.pathsep}{env.get('PATH', '')}"
            # The gateway's own virtualenv must not leak into the stub's interpreter.
            env.pop("PYTHONPATH", None)
            env.pop("VIRTUAL_ENV", None)
        return env

    def start(self, timeout: float = 180.0) -> Self:
        for name in ("grpc_port", "http_port", "metrics_port"):
            if getattr(self, name) == 0:
                # tritonserver cannot be handed a socket or report a port it chose itself
                reserved = reserve_port(self.host)
                self.reservations.append(reserved)
                setattr(self, name, reserved.port)
        if not self.inherit_output:
            self.log_path = self.log_path or self.repository.parent / "tritonserver.log"
        log.info("starting tritonserver (grpc %s), log in %s", self.grpc_url, self.log_path)
        started = time.monotonic()
        remove_regions(self.shm_prefix)  # this server's own, had its last run died
        remove_orphaned_regions()
        self.launch()
        # the server is READY once every model of the repository is (clip_image and clip_text)
        ready = f"{self.http_url}/v2/health/ready"
        try:
            self.wait_for(ready, timeout, "tritonserver models READY", stop_on_timeout=True)
        except BaseException:
            self.release_ports()
            raise
        self.ready_seconds = time.monotonic() - started
        log.info("tritonserver ready in %.1f s", self.ready_seconds)
        return self

    def stop(self, grace: float = 15.0) -> int | None:
        code = super().stop(grace)
        remove_regions(self.shm_prefix)  # a Triton that drained removed its own; one killed did not
        return code

    def kill(self) -> None:
        super().kill()
        remove_regions(self.shm_prefix)

    def reload(self, model: str, timeout: float) -> None:
        """Load ``model`` again from the repository (``reloadable`` servers only). Triton keeps
        serving the loaded version until the new one is READY, then sends it new requests and
        unloads the old once its requests are done: no request fails. One that does not load
        leaves the old serving; the error says why (Triton's log says more)."""
        if not self.reloadable:
            raise RuntimeError("this tritonserver was started without model control")
        request = urllib.request.Request(
            f"{self.http_url}/v2/repository/models/{model}/load", data=b"{}", method="POST",
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                answer.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            raise ProcessStartError(f"Triton did not load {model} again: {detail}") from exc


def remove_regions(prefix: str, directory: Path = SHM_DIR) -> int:
    """Unlink the shared-memory regions whose names start with ``prefix`` (a stopped server's:
    nothing maps them any more, or what still does keeps its mapping until it exits); how many."""
    return _unlink(directory.glob(f"{prefix}*"))


def remove_orphaned_regions(directory: Path = SHM_DIR) -> int:
    """Unlink the regions of Tritons started by processes that have exited (their Tritons died
    with them: ``stop_with_parent``); how many. A region whose owner still runs is left alone."""
    owned: dict[int, list[Path]] = {}
    with contextlib.suppress(FileNotFoundError):
        for path in directory.glob(f"{SHM_PREFIX}*"):
            if match := _SHM_OWNER.match(path.name):
                owned.setdefault(int(match[1]), []).append(path)
    gone = [path for pid, paths in owned.items() if pid != os.getpid() and not alive(pid)
            for path in paths]  # fmt: skip
    removed = _unlink(gone)
    if removed:
        log.info("removed %d shared-memory region(s) of Tritons whose launcher is gone", removed)
    return removed


def _unlink(paths: Iterable[Path]) -> int:
    """Unlink ``paths``, those still there; how many (a missing directory: none)."""
    removed = 0
    with contextlib.suppress(FileNotFoundError):
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed += 1
    return removed
