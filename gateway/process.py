"""A server child process on loopback: start, wait for an HTTP probe, stop with SIGTERM first."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Self


class ProcessStartError(RuntimeError):
    """The process exited or did not answer in time; carries the tail of its log."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass(kw_only=True)
class ServerProcess:
    """Subclasses say how to run themselves (``command``, ``environment``) and what ``start``
    waits for; this class owns the child process, its log, and an orderly stop."""

    #: Run in a session of its own: Ctrl-C in a terminal reaches only us, and we stop it in
    #: order; ``kill`` takes the whole group (e.g. Triton's Python-backend stubs) with it.
    new_session: ClassVar[bool] = False

    log_path: Path | None = None
    #: CPUs to pin the process to (``taskset``), for benchmarks that measure per-core capacity.
    cpus: frozenset[int] | None = None
    #: Write to our own stdout/stderr (a container's log) instead of ``log_path``.
    inherit_output: bool = False
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def command(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        return dict(os.environ)

    def launch(self) -> None:
        pin = ["taskset", "-c", ",".join(map(str, sorted(self.cpus)))] if self.cpus else []
        if self.inherit_output:
            self.process = subprocess.Popen(
                [*pin, *self.command()], env=self.environment(), start_new_session=self.new_session
            )
            return
        with open(self.log_path or os.devnull, "wb") as output:
            self.process = subprocess.Popen(
                [*pin, *self.command()],
                stdout=output,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                start_new_session=self.new_session,
            )

    def wait_for(self, url: str, timeout: float, what: str, *, stop_on_timeout: bool) -> None:
        """Poll ``url`` until it answers 200; fail early if the process exits."""
        import httpx  # the gateway's own dependency; imported here to keep this module light

        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.process is None or self.process.poll() is not None:
                    raise ProcessStartError(f"{what}: the process exited\n{self.log_tail()}")
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(url).status_code == 200:
                        return
                time.sleep(0.1)
        if stop_on_timeout:
            self.stop()
        raise ProcessStartError(f"{what}: not within {timeout:.0f} s\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, grace: float = 15.0) -> int | None:
        """SIGTERM (the server drains), then SIGKILL after ``grace`` seconds; the exit code."""
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

    def kill(self) -> None:
        """SIGKILL without a drain (failure tests), to the process group when it has its own."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                if self.new_session:
                    os.killpg(process.pid, signal.SIGKILL)
                else:
                    process.kill()
            process.wait()

    def start(self, timeout: float = 60.0) -> Self:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start() if self.process is None else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
