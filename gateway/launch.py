"""Run ``python -m gateway`` as a child process on loopback (tests, benchmarks, tooling)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Self

from gateway.process import ServerProcess, free_port


@dataclass
class GatewayProcess(ServerProcess):
    """The real gateway (uvicorn and all) pointed at a Triton gRPC URL; a context manager."""

    triton_url: str
    env: dict[str, str] = field(default_factory=dict)
    port: int = 0
    host: str = "127.0.0.1"

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
        }

    def start(self, timeout: float = 60.0) -> Self:
        self.port = self.port or free_port(self.host)
        self.launch()
        self.wait_for(f"{self.url}/healthz", timeout, "gateway start", stop_on_timeout=True)
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        self.wait_for(f"{self.url}/readyz", timeout, "gateway readiness", stop_on_timeout=False)
