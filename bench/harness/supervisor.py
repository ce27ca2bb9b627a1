"""The one launch path started as users start it, for the benches and the tests (tests import
bench): the container entrypoint or ``clip-gateway serve``, a real process tree (the supervisor,
Triton, the gateway) on four reserved loopback ports, its output in a log file, and the wait
until it is ready.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Self

import httpx

from clip_gateway.config.processes import reserve_port

ROOT = Path(__file__).resolve().parents[2]
#: The container entrypoint: settings from the environment only.
ENTRYPOINT = (sys.executable, "-m", "clip_gateway.launcher.supervisor")
HOST = "127.0.0.1"


class Supervisor:
    """Four ports reserved (the gateway's, Triton's gRPC, HTTP and metrics) until ``close``, and
    the launch path started on them: once, or again in turn on the same ports."""

    def __init__(self, log: Path) -> None:
        self.ports = [reserve_port(HOST) for _ in range(4)]
        self.log = log
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def port(self) -> int:
        return self.ports[0].port

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def process(self) -> subprocess.Popen[bytes]:
        if self._process is None:
            raise RuntimeError("nothing started yet")
        return self._process

    def triton_ports(self) -> dict[str, str]:
        return {
            "GATEWAY_TRITON_GRPC_PORT": str(self.ports[1].port),
            "GATEWAY_TRITON_HTTP_PORT": str(self.ports[2].port),
            "GATEWAY_TRITON_METRICS_PORT": str(self.ports[3].port),
        }

    def entrypoint(self, **env: str) -> Self:
        """The container entrypoint on these ports; ``env`` adds settings (and may override)."""
        ports = {"GATEWAY_HOST": HOST, "GATEWAY_PORT": str(self.port), **self.triton_ports()}
        return self.start(list(ENTRYPOINT), ports | env)

    def serve(self, *args: str, env: dict[str, str] | None = None) -> Self:
        """``clip-gateway serve ARGS --port PORT``, Triton's ports from the environment."""
        command = [sys.executable, "-m", "clip_gateway", "serve", *args, "--port", str(self.port)]
        return self.start(command, self.triton_ports() | (env or {}))

    def start(self, command: list[str], env: dict[str, str]) -> Self:
        if self._process is not None and self._process.poll() is None:
            raise RuntimeError("the previous launch still runs on these ports")
        with open(self.log, "wb") as output:
            self._process = subprocess.Popen(
                command, env={**os.environ, **env}, cwd=ROOT, stdout=output,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        return self

    def says(self, text: str) -> bool:
        """Whether the log holds ``text``; raises with the log's tail once the process exited."""
        if self.process.poll() is not None:
            raise RuntimeError(f"exited {self.process.returncode}:\n{self.tail()}")
        return text in self.log.read_text(errors="replace")

    def ready(self, *, logged: bool = True) -> bool:
        """The supervisor's start-up over (its "ready on http" line, when ``logged``: not at
        ``GATEWAY_LOG_LEVEL=WARNING``) and /readyz answering 200."""
        started = self.says("ready on http")  # raises once the process has exited
        if logged and not started:
            return False
        try:
            return httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_ready(self, timeout: float, *, logged: bool = True, every: float = 0.2) -> Self:
        deadline = time.monotonic() + timeout
        while not self.ready(logged=logged):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.url} not ready in {timeout:g} s:\n{self.tail()}")
            time.sleep(every)
        return self

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def stop(self, grace: float = 120.0) -> int:
        """SIGTERM, then the exit code (killed after ``grace`` seconds: then a TimeoutExpired)."""
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(grace)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise

    def close(self, grace: float = 0.0) -> None:
        """Whatever still runs stopped (SIGTERM and ``grace`` seconds first, when given; else
        killed: its children stop with it), the ports released."""
        if self._process is not None and self._process.poll() is None:
            if grace:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.stop(grace)
            if self._process.poll() is None:
                self._process.kill()
                self._process.wait()
        for reserved in self.ports:
            reserved.release()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def slow_templates(work: Path, hold: Path) -> Path:
    """triton/ with the cpu profile's model held in ``initialize`` until ``hold/release``
    (tests/models/slow_start.py): a long model load or engine build, for stop timings and tests."""
    templates = work / "templates"
    shutil.copytree(ROOT / "triton", templates)
    real = (ROOT / "triton" / "python" / "model.py").read_text()
    suffix = (ROOT / "tests" / "models" / "slow_start.py").read_text()
    (templates / "python" / "model.py").write_text(
        real + "\n" + suffix.replace("HOLD_DIR", str(hold))
    )
    return templates
