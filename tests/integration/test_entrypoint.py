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

from gateway.process import free_port
from tests import samples

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
    port = free_port()
    env = {
        **os.environ,
        "GATEWAY_MODEL_DIR": str(exported.directory),
        "GATEWAY_REPOSITORY_DIR": str(tmp_path / "repo"),
        "GATEWAY_TRITON_PROFILE": "auto",  # no GPU here: detection must pick cpu
        "GATEWAY_HOST": "127.0.0.1",
        "GATEWAY_PORT": str(port),
        "GATEWAY_TRITON_GRPC_PORT": str(free_port()),
        "GATEWAY_TRITON_HTTP_PORT": str(free_port()),
        "GATEWAY_TRITON_METRICS_PORT": str(free_port()),
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


def test_entrypoint_serves_and_drains_on_sigterm(entrypoint) -> None:
    process, url, log = entrypoint
    kids = children(process.pid)
    assert len(kids) == 2  # tritonserver and the gateway
    ok = httpx.post(
        f"{url}/v1/embeddings", files=[("image", ("a.jpg", samples.compact(0), "image/jpeg"))]
    )
    assert ok.status_code == 200
    # a request that takes seconds on this CPU: 64 images, two batches of 32 through the model
    files = [("image", (f"{i}.jpg", samples.compact(i), "image/jpeg")) for i in range(64)]
    answer: dict[str, object] = {}

    def slow() -> None:
        answer["response"] = httpx.post(f"{url}/v1/embeddings", files=files, timeout=120)
        answer["finished"] = time.monotonic()

    thread = threading.Thread(target=slow)
    thread.start()
    time.sleep(0.5)  # it is in flight
    signalled = time.monotonic()
    process.send_signal(signal.SIGTERM)
    thread.join(120)
    assert process.wait(120) == 0, log.read_text()[-3000:]
    response = answer["response"]
    assert isinstance(response, httpx.Response)
    assert response.status_code == 200  # drained, not dropped
    assert len(response.json()["data"]) == 64
    assert answer["finished"] > signalled  # it really was in flight when SIGTERM arrived
    assert not any(alive(pid) for pid in kids)
    text = log.read_text()
    assert "Triton profile cpu (no GPU)" in text
    assert "draining the gateway" in text


def test_entrypoint_exits_nonzero_when_triton_dies(entrypoint) -> None:
    process, _, log = entrypoint
    triton = next(pid for pid in children(process.pid)
                  if "tritonserver" in Path(f"/proc/{pid}/cmdline").read_text())  # fmt: skip
    os.killpg(triton, signal.SIGKILL)
    assert process.wait(60) == 1
    assert "tritonserver exited" in log.read_text()
