"""Run ``python -m gateway`` as a child process on loopback (tests, benchmarks, tooling)."""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass, field
from typing import Self

from gateway.process import ServerProcess, listening_socket


@dataclass
class GatewayProcess(ServerProcess):
    """The real gateway (uvicorn and all) pointed at a Triton gRPC URL; a context manager."""

    triton_url: str
    env: dict[str, str] = field(default_factory=dict)
    port: int = 0
    host: str = "127.0.0.1"
    #: The listening socket, bound here and inherited by the child (no port race).
    sock: socket.socket | None = field(default=None, init=False, repr=False)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "gateway"]

    def environment(self) -> dict[str, str]:
        return {
            **os.environ,
            "GATEWAY_HOST": self.host,
            "GATEWAY_PORT": str(self.port),
            "GATEWAY_TRITON_URL": self.triton_url,
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
