"""Helpers of `make image-test`: the image (clip-gateway:local, `make image`) run with podman
the way users run it. Containers and volumes are named with a prefix of their own and removed
before and after, so a second run on the same machine starts clean."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("CLIP_GATEWAY_IMAGE", "clip-gateway:local")
PREFIX = "clip-gateway-image-test"
VOLUME = f"{PREFIX}-engines"
KEY = "image-test-key-0123456789"
#: The start-up budget the containers run with (GATEWAY_STARTUP_TIMEOUT_S): the supervisor gives
#: up by itself past it, so waiting a little longer always ends in ready or exited.
STARTUP_S = 600
os.environ.setdefault("CONTAINERS_CONF", str(ROOT / "deploy" / "image" / "containers.conf"))


def podman(
    *args: str, check: bool = True, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: {result.returncode}\n{result.stderr}")
    return result


def remove_leftovers() -> None:
    """Containers and the volume of an earlier run (finished, crashed or interrupted)."""
    names = podman("ps", "-a", "--format", "{{.Names}}", check=False).stdout.split()
    ours = [name for name in names if name.startswith(PREFIX)]
    if ours:
        podman("rm", "-f", "-v", "-t", "0", *ours, check=False)
    podman("volume", "rm", "-f", VOLUME, check=False)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Container:
    name: str
    port: int
    started: float
    ready_s: float | None = None
    env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def logs(self) -> str:
        result = podman("logs", self.name, check=False)
        return result.stdout + result.stderr

    def inspect(self) -> dict:
        return json.loads(podman("inspect", self.name).stdout)[0]

    def exec(self, *command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return podman("exec", self.name, *command, check=check, timeout=120)

    def wait_ready(self) -> None:
        """Until /readyz answers 200 (recording how long the start took), or the container
        exits, or the start-up budget is spent."""
        deadline = self.started + STARTUP_S + 30
        while time.monotonic() < deadline:
            state = self.inspect()["State"]
            if not state["Running"]:
                raise AssertionError(f"exited with {state['ExitCode']}:\n{self.logs()[-6000:]}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    self.ready_s = time.monotonic() - self.started
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"not ready within {STARTUP_S} s:\n{self.logs()[-6000:]}")


@dataclass
class Secrets:
    directory: Path

    @property
    def keys_file(self) -> Path:
        return self.directory / "api-keys"


def run_container(name: str, secrets: Secrets, **env: str) -> Container:
    """``podman run`` as docs/DEPLOY.md tells users to, hardened as the Kubernetes manifest runs it:
    uid 10001, read-only root filesystem (a tmpfs for /tmp, the engine-cache volume), every
    capability dropped, no privilege escalation, 1 GiB of /dev/shm, the API key from a mounted
    file, only the gateway's port published, on loopback."""
    port = free_port()
    settings = {"GATEWAY_STARTUP_TIMEOUT_S": str(STARTUP_S), **env}
    podman("rm", "-f", "-v", "-t", "0", name, check=False)
    started = time.monotonic()
    podman(
        "run", "-d", "--name", name,
        "--user", "10001:10001",
        "--read-only", "--read-only-tmpfs=false", "--tmpfs", "/tmp:rw,size=512m,mode=1777",
        "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
        "--shm-size", "1g",
        "--cpus", "2",
        "-p", f"127.0.0.1:{port}:8000",
        "-v", f"{VOLUME}:/var/cache/clip-gateway",
        "-v", f"{secrets.keys_file}:/run/secrets/api_keys:ro",
        "-e", "GATEWAY_API_KEYS_FILE=/run/secrets/api_keys",
        *[arg for key, value in settings.items() for arg in ("-e", f"{key}={value}")],
        IMAGE,
    )  # fmt: skip
    return Container(name, port, started, env=settings)
