"""Child server processes on loopback: start, wait for an HTTP probe, stop with SIGTERM first.

Every child is started with a parent-death signal (SIGTERM): if the process that started it is
killed outright (SIGKILL, OOM), the children stop themselves instead of living on as orphans.
Ports are race-free: the gateway is handed an already bound socket, and Triton, which must be
told a port number, gets one reserved under a lock below the kernel's ephemeral range.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, ClassVar, Self

from clip_gateway.config.settings import with_new_names

_PR_SET_PDEATHSIG = 1


class ProcessStartError(RuntimeError):
    """The process exited or did not answer in time; carries the tail of its log."""


class LaunchError(RuntimeError):
    """Start-up cannot go on (missing weights, no export tooling, a backend Triton lacks); the
    message says why."""


class Interrupted(RuntimeError):
    """A stop was requested (a signal) while waiting for a child to start."""


def _load_prctl() -> Callable[..., int] | None:
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError, TypeError):  # no libc prctl (not Linux)
        return None
    return prctl


#: libc's prctl, looked up once at import so that a child's ``preexec_fn`` finds it after the
#: fork without loading anything there; None where there is none.
_PRCTL = _load_prctl()


def stop_with_parent(parent: int | None = None) -> None:
    """This process gets SIGTERM when its parent dies (Linux prctl; a no-op elsewhere): a
    uvicorn worker whose manager is killed, or a child, as its ``preexec_fn``
    (``functools.partial(stop_with_parent, os.getpid())``). ``parent``: the pid that started
    it; already gone (it died before prctl took effect), this process exits at once."""
    if _PRCTL is None:
        return
    _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if parent is not None and os.getppid() != parent:
        os._exit(1)


def listening_socket(host: str = "127.0.0.1", port: int = 0, backlog: int = 2048) -> socket.socket:
    """A bound, listening TCP socket to hand to a child process (uvicorn ``fd=``).

    Binding port 0 here and passing the socket on is the only race-free way to give a server a
    free port: nothing can take it between the choice and the bind, because they are one step.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # uvicorn wraps an fd as an AF_UNIX socket, so asyncio never sets TCP_NODELAY on the
    # connections it accepts: a keep-alive client's next request then waited ~40 ms (Nagle
    # holding the response's second write for the client's delayed ACK). Linux copies the
    # option from the listening socket to every accepted one.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    sock.set_inheritable(True)
    return sock


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


@dataclass(eq=False)
class ReservedPort:
    """A loopback port held for a server that cannot be handed a socket (tritonserver).

    The port lies below the kernel's ephemeral range, so no ``connect()`` and no port-0 bind is
    ever given it; an exclusive lock file keeps our other processes (parallel test sessions, a
    second server) from choosing it. The reservation lasts until ``release`` (or garbage
    collection), so a server restarted on the same ports finds them still free.
    """

    port: int
    _lock: IO[bytes] | None = field(default=None, repr=False)

    def release(self) -> None:
        if self._lock is not None:
            self._lock.close()  # closing the file drops the flock
            self._lock = None


def reserve_port(host: str = "127.0.0.1") -> ReservedPort:
    locks = Path(tempfile.gettempdir()) / f"clip-gateway-ports-{os.getuid()}"
    locks.mkdir(mode=0o700, exist_ok=True)
    owner = locks.stat()
    if owner.st_uid != os.getuid() or owner.st_mode & 0o077:  # made by someone else: not ours
        raise RuntimeError(f"{locks} is not a private directory of this user; remove it")
    low, _high = _ephemeral_range()
    chooser = random.SystemRandom()
    for _ in range(500):
        port = chooser.randrange(max(1024, low - 12000), low)
        lock = open(locks / f"{port}.lock", "ab")  # noqa: SIM115 (held open: the reservation)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind((host, port))
        except OSError:  # something outside our control listens there
            lock.close()
            continue
        return ReservedPort(port, lock)
    raise RuntimeError(f"no free port below {low} on {host}")


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
    #: Set when the launcher is asked to stop: start-up waits give up at once (``Interrupted``).
    stop_requested: threading.Event | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def command(self) -> list[str]:
        raise NotImplementedError

    def environment(self) -> dict[str, str]:
        return with_new_names(os.environ)

    def inherited_fds(self) -> tuple[int, ...]:
        """File descriptors the child inherits (a listening socket)."""
        return ()

    def launch(self) -> None:
        pin = ["taskset", "-c", ",".join(map(str, sorted(self.cpus)))] if self.cpus else []
        with contextlib.ExitStack() as stack:
            output = None
            if not self.inherit_output:
                output = stack.enter_context(open(self.log_path or os.devnull, "ab"))
            self.process = subprocess.Popen(
                [*pin, *self.command()],
                stdout=output,
                stderr=subprocess.STDOUT if output else None,
                env=self.environment(),
                start_new_session=self.new_session,
                pass_fds=self.inherited_fds(),
                preexec_fn=functools.partial(stop_with_parent, os.getpid()),
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
                if self.stop_requested is not None and self.stop_requested.wait(0.1):
                    raise Interrupted(f"{what}: stop requested")
                if self.stop_requested is None:
                    time.sleep(0.1)
        if stop_on_timeout:
            self.stop()
        raise ProcessStartError(f"{what}: not within {timeout:.0f} s\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, grace: float = 15.0) -> int | None:
        """SIGTERM (the server drains), then SIGKILL after ``grace`` seconds; the exit code.
        With a session of its own, whatever of the group is left (Triton's stubs) goes too."""
        process, self.process = self.process, None
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(grace)
            except subprocess.TimeoutExpired:
                process.kill()
        code = process.wait()
        if self.new_session:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
        return code

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


@dataclass
class GatewayProcess(ServerProcess):
    """The gateway's HTTP process (``python -m clip_gateway.http``: uvicorn, its workers, the app)
    pointed at a Triton gRPC URL; a context manager. It is handed its listening socket."""

    triton_url: str
    env: dict[str, str] = field(default_factory=dict)
    port: int = 0
    #: Triton's HTTP endpoint, for the inference calls (None: they go over gRPC too)
    triton_http_url: str | None = None
    host: str = "127.0.0.1"
    #: The listening socket, bound here and inherited by the child (no port race).
    sock: socket.socket | None = field(default=None, init=False, repr=False)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "clip_gateway.http"]

    def environment(self) -> dict[str, str]:
        return {
            **with_new_names(os.environ),
            "GATEWAY_HOST": self.host,
            "GATEWAY_PORT": str(self.port),
            "GATEWAY_TRITON_URL": self.triton_url,
            **({"GATEWAY_TRITON_HTTP_URL": self.triton_http_url} if self.triton_http_url else {}),
            "GATEWAY_WORKERS": "1",
            **self.env,
            **({"GATEWAY_LISTEN_FD": str(self.sock.fileno())} if self.sock else {}),
        }

    def inherited_fds(self) -> tuple[int, ...]:
        return (self.sock.fileno(),) if self.sock else ()

    def start(self, timeout: float = 60.0) -> Self:
        if self.sock is None:
            self.sock = listening_socket(self.host, self.port)
            self.port = int(self.sock.getsockname()[1])
        self.launch()
        self.wait_for(f"{self.url}/healthz", timeout, "gateway start", stop_on_timeout=True)
        return self

    def stop(self, grace: float = 15.0) -> int | None:
        code = super().stop(grace)
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        return code

    def wait_ready(self, timeout: float = 60.0) -> None:
        self.wait_for(f"{self.url}/readyz", timeout, "gateway readiness", stop_on_timeout=False)
