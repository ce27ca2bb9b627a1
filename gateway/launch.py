"""Run ``python -m gateway`` as a child process on loopback (tests, benchmarks, tooling)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import httpx

from gateway.localtriton import free_port


@dataclass
class GatewayProcess:
    """The real gateway (uvicorn and all) pointed at a Triton gRPC URL; a context manager."""

    triton_url: str
    env: dict[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    port: int = 0
    host: str = "127.0.0.1"
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 60.0) -> GatewayProcess:
        self.port = self.port or free_port(self.host)
        env = {
            **os.environ,
            "GATEWAY_HOST": self.host,
            "GATEWAY_PORT": str(self.port),
            "GATEWAY_TRITON_URL": self.triton_url,
            "GATEWAY_WORKERS": "1",
            **self.env,
        }
        with open(self.log_path or os.devnull, "wb") as output:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gateway"], env=env, stdout=output, stderr=subprocess.STDOUT
            )
        self._wait_healthy(timeout)
        return self

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.process is None or self.process.poll() is not None:
                    raise RuntimeError(f"gateway exited during start:\n{self.log_tail()}")
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{self.url}/healthz").status_code == 200:
                        return
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"gateway not healthy after {timeout:.0f} s:\n{self.log_tail()}")

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{self.url}/readyz").status_code == 200:
                        return
                time.sleep(0.1)
        raise RuntimeError(f"gateway not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, grace: float = 15.0) -> int | None:
        process, self.process = self.process, None
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                return process.wait(grace)
            except subprocess.TimeoutExpired:
                process.kill()
        return process.wait()

    def __enter__(self) -> GatewayProcess:
        return self.start() if self.process is None else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
