"""The one launch path, run as users and orchestrators run it: ``clip-gateway serve`` (what
``make serve`` runs) and the container entrypoint, as real process trees (supervisor, Triton
and its Python-backend stubs, the gateway), stopped by each signal they may get.

A stop must drain in-flight requests, leave no process, shared-memory segment or scratch
directory behind and exit 0; a killed supervisor's children must stop by themselves.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from gateway.runtime.processes import ReservedPort, reserve_port
from tests import samples
from tests.controlled import wait_until
from tests.metrics import sample

ROOT = Path(__file__).resolve().parents[2]


def parent_of(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def descendants(pid: int) -> set[int]:
    parents = {
        int(p.name): parent_of(int(p.name)) for p in Path("/proc").iterdir() if p.name.isdigit()
    }
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def shm_of(pids: set[int]) -> list[str]:
    return [p.name for p in Path("/dev/shm").glob("clipgw_*") if int(p.name.split("_")[1]) in pids]


@dataclass
class Launched:
    process: subprocess.Popen[bytes]
    url: str
    log: Path
    scratch: Path
    ports: list[ReservedPort] = field(default_factory=list)

    def tree(self) -> set[int]:
        return descendants(self.process.pid)

    def find(self, name: str) -> int:
        (pid,) = [p for p in self.tree() if name in cmdline(p) and "backend_stub" not in cmdline(p)]
        return pid


def launch(
    command: list[str], env: dict[str, str], tmp_path: Path, port: int
) -> subprocess.Popen[bytes]:
    log = tmp_path / "launch.log"
    with open(log, "wb") as output:
        return subprocess.Popen(
            command, env={**os.environ, **env}, cwd=ROOT, stdout=output, stderr=subprocess.STDOUT
        )


@pytest.fixture(params=["serve", "entrypoint"])
def launched(request, exported, tmp_path: Path) -> Iterator[Launched]:
    """``clip-gateway serve`` (the make serve path) or the container entrypoint, READY."""
    ports = [reserve_port() for _ in range(4)]
    port = ports[0].port
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = {
        "GATEWAY_SCRATCH_DIR": str(scratch),
        "GATEWAY_TRITON_GRPC_PORT": str(ports[1].port),
        "GATEWAY_TRITON_HTTP_PORT": str(ports[2].port),
        "GATEWAY_TRITON_METRICS_PORT": str(ports[3].port),
        "GATEWAY_DRAIN_S": "60",
    }
    if request.param == "serve":
        # the cache the session's export lives in: `serve` finds the model there
        cache = exported.directory.parents[1]
        command = [sys.executable, "-m", "gateway", "serve", "--weights", "random",
                   "--port", str(port), "--cache-dir", str(cache),
                   "--log-file", str(tmp_path / "children.log")]  # fmt: skip
    else:
        env |= {
            "GATEWAY_MODEL_DIR": str(exported.directory),
            # named, not detected: the test must not depend on whether this host has a GPU
            "GATEWAY_TRITON_PROFILE": "cpu",
            "GATEWAY_HOST": "127.0.0.1",
            "GATEWAY_PORT": str(port),
        }
        command = [sys.executable, "-m", "gateway.runtime.supervisor"]
    process = launch(command, env, tmp_path, port)
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "launch.log"

    def ready() -> bool:
        assert process.poll() is None, log.read_text()[-3000:]
        try:
            return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(ready, "the launched gateway is ready", timeout=180, every=0.2)
        yield Launched(process, url, log, scratch, ports)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for reserved in ports:
            reserved.release()


def embed(url: str, count: int = 1) -> httpx.Response:
    files = [("image", (f"{i}.jpg", samples.compact(i), "image/jpeg")) for i in range(count)]
    return httpx.post(f"{url}/v1/embeddings", files=files, timeout=120)


def assert_nothing_left(launched: Launched, tree: set[int]) -> None:
    wait_until(lambda: not [p for p in tree if alive(p)], "every process of the tree exited")
    assert not shm_of(tree), "shared-memory segments left behind"
    assert not list(launched.scratch.iterdir()), "scratch directory left behind"


def test_sigterm_drains_an_in_flight_request_then_stops_everything(launched: Launched) -> None:
    tree = launched.tree()
    names = " | ".join(cmdline(p) for p in tree)
    assert "tritonserver" in names and "gateway.http" in names and "backend_stub" in names
    assert embed(launched.url).status_code == 200
    triton = launched.find("tritonserver")
    answer: dict[str, httpx.Response] = {}
    # Triton paused: the request is admitted, decoded and then waits on its gRPC call, in
    # flight for as long as the test needs (observable in the gateway's own gauge)
    os.kill(triton, signal.SIGSTOP)
    try:
        thread = threading.Thread(target=lambda: answer.update(r=embed(launched.url, 4)))
        thread.start()
        wait_until(
            lambda: (
                sample(httpx.get(f"{launched.url}/metrics").text, "gateway_inflight_images") == 4
            ),
            "the request is in flight",
        )
        launched.process.send_signal(signal.SIGTERM)
        wait_until(lambda: "SIGTERM: stopping" in launched.log.read_text(), "SIGTERM handled")
    finally:
        os.kill(triton, signal.SIGCONT)
    thread.join(120)
    assert launched.process.wait(120) == 0, launched.log.read_text()[-3000:]
    assert answer["r"].status_code == 200  # drained, not dropped
    assert len(answer["r"].json()["data"]) == 4
    assert_nothing_left(launched, tree)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP])
def test_every_stop_signal_stops_everything_cleanly(launched: Launched, signum: int) -> None:
    tree = launched.tree()
    assert embed(launched.url).status_code == 200  # shared-memory regions now exist
    assert shm_of(tree)
    launched.process.send_signal(signum)
    assert launched.process.wait(120) == 0, launched.log.read_text()[-3000:]
    assert_nothing_left(launched, tree)


def test_a_killed_supervisor_leaves_nothing_running(launched: Launched) -> None:
    tree = launched.tree()
    assert embed(launched.url).status_code == 200
    launched.process.kill()  # SIGKILL: no handler runs in the supervisor
    launched.process.wait()
    # the children get SIGTERM from the kernel (parent-death signal) and stop by themselves
    wait_until(lambda: not [p for p in tree if alive(p)], "children exited on their own")
    assert not shm_of(tree)


def test_a_dead_triton_stops_the_service_with_an_error(launched: Launched) -> None:
    os.kill(launched.find("tritonserver"), signal.SIGKILL)
    assert launched.process.wait(120) == 1
    assert "tritonserver exited" in launched.log.read_text()


def test_serve_runs_another_open_clip_model(exported, tmp_path: Path) -> None:
    """``make serve CLIP_MODEL=ViT-B-16-SigLIP CLIP_WEIGHTS=random``: exported by the launch path
    (or found in the cache), served with its own dimension, and named by its own id."""
    ports = [reserve_port() for _ in range(4)]
    env = {
        "GATEWAY_SCRATCH_DIR": str(tmp_path),
        "GATEWAY_TRITON_GRPC_PORT": str(ports[1].port),
        "GATEWAY_TRITON_HTTP_PORT": str(ports[2].port),
        "GATEWAY_TRITON_METRICS_PORT": str(ports[3].port),
    }
    command = [sys.executable, "-m", "gateway", "serve", "--model", "ViT-B-16-SigLIP",
               "--weights", "random", "--port", str(ports[0].port),
               "--cache-dir", str(exported.directory.parents[1]),
               "--log-file", str(tmp_path / "children.log")]  # fmt: skip
    process = launch(command, env, tmp_path, ports[0].port)
    url = f"http://127.0.0.1:{ports[0].port}"

    def ready() -> bool:
        assert process.poll() is None, (tmp_path / "launch.log").read_text()[-3000:]
        try:
            return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        # a first run exports the model first (about a minute on the 2-core CI machine)
        wait_until(ready, "the launched SigLIP gateway is ready", timeout=600, every=0.5)
        (model,) = httpx.get(f"{url}/v1/models", timeout=10).json()["data"]
        assert model["id"] == "ViT-B-16-SigLIP"
        answer = embed(url)
        assert answer.status_code == 200
        assert len(answer.json()["data"][0]["embedding"]) == 768
        process.send_signal(signal.SIGTERM)
        assert process.wait(120) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for reserved in ports:
            reserved.release()
