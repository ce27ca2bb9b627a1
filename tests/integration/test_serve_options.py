"""``GATEWAY_PORT=<port> clip-gateway serve``, run as a user runs it: every launch setting from
the environment, no flag, and the gateway answers HTTP on the port the environment named (under
the old argparse ``serve`` its own defaults hid GATEWAY_PORT, _MODEL, _WEIGHTS and
_TRITON_PROFILE)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from clip_gateway.config.processes import reserve_port
from tests import samples
from tests.controlled import wait_until

ROOT = Path(__file__).resolve().parents[2]


def test_serve_takes_its_port_model_and_weights_from_the_environment(
    exported, tmp_path: Path
) -> None:
    ports = [reserve_port() for _ in range(4)]
    port = ports[0].port
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = {
        **os.environ,
        "GATEWAY_PORT": str(port),
        "GATEWAY_MODEL": "ViT-B-32",
        "GATEWAY_WEIGHTS": "random",
        "GATEWAY_TRITON_PROFILE": "cpu",
        "GATEWAY_CACHE_DIR": str(exported.directory.parents[1]),  # the session's export
        "GATEWAY_LOG_FILE": str(tmp_path / "children.log"),
        "GATEWAY_SCRATCH_DIR": str(scratch),
        "GATEWAY_TRITON_GRPC_PORT": str(ports[1].port),
        "GATEWAY_TRITON_HTTP_PORT": str(ports[2].port),
        "GATEWAY_TRITON_METRICS_PORT": str(ports[3].port),
    }
    log = tmp_path / "serve.log"
    url = f"http://127.0.0.1:{port}"
    with open(log, "wb") as output:
        process = subprocess.Popen([sys.executable, "-m", "clip_gateway", "serve"], env=env,
                                   cwd=ROOT,
                                   stdout=output, stderr=subprocess.STDOUT)  # fmt: skip

    def ready() -> bool:
        assert process.poll() is None, log.read_text()[-3000:]
        if f"ready on {url}" not in log.read_text():
            return False
        try:
            return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(ready, f"serve ready on GATEWAY_PORT {port}", timeout=180, every=0.2)
        (card,) = httpx.get(f"{url}/v1/models", timeout=10).json()["data"]
        assert card["id"] == "ViT-B-32"
        image = ("image", ("0.jpg", samples.compact(0), "image/jpeg"))
        answer = httpx.post(f"{url}/v1/embeddings", files=[image], timeout=120)
        assert answer.status_code == 200, answer.text
        assert len(answer.json()["data"][0]["embedding"]) == 512
        assert (tmp_path / "children.log").stat().st_size > 0  # GATEWAY_LOG_FILE, not the cache's
        process.send_signal(signal.SIGTERM)
        assert process.wait(120) == 0, log.read_text()[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for reserved in ports:
            reserved.release()
