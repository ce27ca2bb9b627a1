"""The container entrypoint, run without Docker: cpu profile, the PyPI Triton, real HTTP.

It must come up ready, embed, keep a request that is in flight when SIGTERM arrives (uvicorn
drains it), and leave no tritonserver or gateway behind; if Triton dies, it must exit non-zero.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from gateway.process import reserve_port
from tests import samples
from tests.controlled import wait_until
from tests.metrics import sample

ROOT = Path(__file__).resolve().parents[2]


def children(pid: int) -> set[int]:
    found = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                stat = (proc / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(proc.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture
def entrypoint(exported, tmp_path: Path):
    reserved = [reserve_port() for _ in range(4)]
    port, grpc_port, http_port, metrics_port = (r.port for r in reserved)
    env = {
        **os.environ,
        "GATEWAY_MODEL_DIR": str(exported.directory),
        "GATEWAY_REPOSITORY_DIR": str(tmp_path / "repo"),
        # named, not detected: the test must not depend on whether this host has a GPU
        "GATEWAY_TRITON_PROFILE": "cpu",
        "GATEWAY_HOST": "127.0.0.1",
        "GATEWAY_PORT": str(port),
        "GATEWAY_TRITON_GRPC_PORT": str(grpc_port),
        "GATEWAY_TRITON_HTTP_PORT": str(http_port),
        "GATEWAY_TRITON_METRICS_PORT": str(metrics_port),
        "GATEWAY_DRAIN_S": "60",
    }
    log = tmp_path / "entrypoint.log"
    with open(log, "wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "gateway.entrypoint"], env=env, cwd=ROOT,
            stdout=output, stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()[-3000:]
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    else:
        process.kill()
        pytest.fail(log.read_text()[-3000:])
    yield process, url, log
    if process.poll() is None:
        process.kill()
        process.wait()
    for r in reserved:
        r.release()


def test_entrypoint_serves_and_drains_on_sigterm(entrypoint) -> None:
    process, url, log = entrypoint
    kids = children(process.pid)
    assert len(kids) == 2  # tritonserver and the gateway
    triton, gateway = sorted(kids, key=lambda pid: "tritonserver" not in cmdline(pid))
    ok = httpx.post(
        f"{url}/v1/embeddings", files=[("image", ("a.jpg", samples.compact(0), "image/jpeg"))]
    )
    assert ok.status_code == 200
    files = [("image", (f"{i}.jpg", samples.compact(i), "image/jpeg")) for i in range(4)]
    answer: dict[str, object] = {}

    def in_flight() -> None:
        answer["response"] = httpx.post(f"{url}/v1/embeddings", files=files, timeout=120)

    # Triton paused: the request is admitted, decoded and then waits on its gRPC call, in
    # flight for as long as the test needs (observable in the gateway's own gauge)
    os.kill(triton, signal.SIGSTOP)
    try:
        thread = threading.Thread(target=in_flight)
        thread.start()
        wait_until(
            lambda: sample(httpx.get(f"{url}/metrics").text, "gateway_inflight_images") == 4,
            "the request is in flight",
        )
        process.send_signal(signal.SIGTERM)
        wait_until(lambda: "draining the gateway" in log.read_text(), "SIGTERM was handled")
    finally:
        os.kill(triton, signal.SIGCONT)
    thread.join(120)
    assert process.wait(120) == 0, log.read_text()[-3000:]
    response = answer["response"]
    assert isinstance(response, httpx.Response)
    assert response.status_code == 200  # drained, not dropped
    assert len(response.json()["data"]) == 4
    assert not any(alive(pid) for pid in kids)
    assert not list(Path("/dev/shm").glob(f"clipgw_{gateway}_*"))  # its regions were removed
    assert "Triton profile cpu (set by GATEWAY_TRITON_PROFILE)" in log.read_text()


def cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_text()


def test_entrypoint_exits_nonzero_when_triton_dies(entrypoint) -> None:
    process, _, log = entrypoint
    triton = next(pid for pid in children(process.pid)
                  if "tritonserver" in Path(f"/proc/{pid}/cmdline").read_text())  # fmt: skip
    os.killpg(triton, signal.SIGKILL)
    assert process.wait(60) == 1
    assert "tritonserver exited" in log.read_text()
