"""One system at a time on loopback, measured cell by cell: Infinity (its own virtualenv,
``.peer-env``) or the gateway through the container entrypoint (the one launch path), each cell a
batch size and a number of concurrent clients, bounded by a request count and a duration."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson

from bench.harness import load
from bench.harness.clients import Batches, GatewayClient
from bench.harness.load import Reply
from bench.harness.machine import wait_quiet
from bench.harness.photos import compact_jpeg
from bench.harness.supervisor import Supervisor
from clip_gateway.config.processes import reserve_port

ROOT = Path(__file__).resolve().parents[2]

PEER_ENV = ROOT / ".peer-env"
#: (batch, concurrency) cells, measured for every system in this order.
CELLS = tuple((batch, clients) for batch in (1, 8, 32) for clients in (1, 4))


@dataclass(frozen=True)
class Limits:
    """How much each cell measures: at most ``requests`` requests and ``seconds`` seconds, after
    ``warmup`` unmeasured ones."""

    seconds: float
    requests: int
    warmup: int
    distinct_images: int = 64
    quiet_wait_s: float = 600.0


FULL = Limits(seconds=30.0, requests=400, warmup=2)
SMOKE = Limits(seconds=1.0, requests=2, warmup=1, distinct_images=8, quiet_wait_s=0.0)


def cell_name(batch: int, clients: int) -> str:
    return f"b{batch}xc{clients}"


@dataclass
class InfinityClient:
    """Infinity's image route: base64 JPEG data URIs in JSON, base64 float32 vectors back."""

    url: str
    batches: Batches
    model: str = "clip"
    http: httpx.AsyncClient = field(init=False)
    bodies: list[bytes] = field(init=False)

    def __post_init__(self) -> None:
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        self.http = httpx.AsyncClient(base_url=self.url, timeout=600, limits=limits)
        self.bodies = [request_body(batch, self.model) for batch in self.batches.batches]

    async def __call__(self, index: int) -> Reply:
        slot = index % len(self.bodies)
        body = self.bodies[slot]
        try:
            response = await self.http.post(
                "/embeddings_image", content=body, headers={"Content-Type": "application/json"}
            )
        except httpx.HTTPError:
            return Reply(599, 0, len(body))
        images = len(self.batches.batches[slot])
        if response.status_code != 200:
            return Reply(response.status_code, images, len(body), len(response.content))
        rows = vectors(response.content)
        correct = None if rows.shape[0] == images else False
        return Reply(200, images, len(body), len(response.content), correct)

    async def close(self) -> None:
        await self.http.aclose()


def request_body(images: list[bytes], model: str) -> bytes:
    uris = ["data:image/jpeg;base64," + base64.b64encode(data).decode() for data in images]
    return orjson.dumps({"model": model, "input": uris, "encoding_format": "base64"})


def vectors(content: bytes) -> np.ndarray:
    """Infinity's OpenAI-shaped answer with base64 float32 embeddings, as rows."""
    data = orjson.loads(content)["data"]
    return np.stack([np.frombuffer(base64.b64decode(row["embedding"]), "<f4") for row in data])


def wait_http(url: str, process: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    """Until ``url`` answers 200 (``log``'s end if ``process`` exits first or time runs out)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"exited {process.returncode}: {log.read_text()[-2000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise TimeoutError(f"{url} not ready in {timeout:.0f} s: {log.read_text()[-2000:]}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(120)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def infinity(work: Path) -> Iterator[str]:
    """Infinity on a loopback port, serving a random ViT-B/32-sized HF CLIP, offline."""
    python = PEER_ENV / "bin" / "python"
    if not python.exists():
        raise RuntimeError(f"{PEER_ENV} is missing: make peer-env makes it (docs/BENCHMARKS.md)")
    import open_clip  # its CLIP BPE file is the peer's tokenizer vocabulary

    checkpoint = work / "peer-clip"
    bpe = Path(open_clip.__file__).parent / "bpe_simple_vocab_16e6.txt.gz"
    subprocess.run([str(python), "-m", "bench.harness.peer_checkpoint", str(checkpoint), str(bpe)],
                   cwd=ROOT, check=True, capture_output=True)  # fmt: skip
    port = reserve_port()
    log = work / "infinity.log"
    env = os.environ | {"HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "1",
                        "INFINITY_ANONYMOUS_USAGE_STATS": "0"}  # fmt: skip
    command = [str(PEER_ENV / "bin" / "infinity_emb"), "v2", "--model-id", str(checkpoint),
               "--served-model-name", "clip", "--engine", "torch", "--device", "cpu",
               "--batch-size", "32", "--host", "127.0.0.1", "--port", str(port.port)]  # fmt: skip
    port.release()
    with open(log, "wb") as output:
        process = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port.port}"
        wait_http(f"{url}/health", process, log, timeout=600)
        yield url
    finally:
        _stop(process)


@contextlib.contextmanager
def gateway(profile: str, export_dir: Path, work: Path, env: dict[str, str]) -> Iterator[str]:
    """The container entrypoint (the one launch path) on loopback, ``profile``, READY."""
    scratch = Path(tempfile.mkdtemp(prefix=f"{profile}-", dir=work))
    with Supervisor(scratch / "launch.log") as supervisor:
        supervisor.entrypoint(**{
            "GATEWAY_MODEL_DIR": str(export_dir),
            "GATEWAY_TRITON_PROFILE": profile,
            "GATEWAY_SCRATCH_DIR": str(scratch),
            "GATEWAY_LOG_LEVEL": "WARNING",  # so no "ready on http" line: /readyz alone says
            "GATEWAY_MAX_ITEMS_PER_REQUEST": "64",
        } | env)  # fmt: skip
        try:
            supervisor.wait_ready(600, logged=False, every=0.5)
            # without a choice recorded here, auto serves at once and builds every candidate
            # (NNCF's ~4.5 min on 2 cores), times them and switches in the background, and a CPU
            # profile times its core plans: what is measured is what they chose
            switched(supervisor.url, 1500, auto=profile == "auto")
            yield supervisor.url
        finally:
            supervisor.close(grace=120)


async def measure(make: Callable[[Batches], Any], limits: Limits,
                  cells: tuple[tuple[int, int], ...] = CELLS) -> dict[str, Any]:  # fmt: skip
    """Every cell against one running system: warm-up, then the bounded closed loop."""
    pool = [compact_jpeg(seed) for seed in range(limits.distinct_images)]
    found: dict[str, Any] = {}
    for batch, clients in cells:
        batches = Batches([[pool[(i * batch + j) % len(pool)] for j in range(batch)]
                           for i in range(16)])  # fmt: skip
        client = make(batches)
        try:
            for i in range(limits.warmup):
                await client(-1 - i)
            records = await load.closed_loop(
                client, clients, count=limits.requests, duration=limits.seconds
            )
        finally:
            await client.close()
        summary = load.summarize(records)
        summary["cell"] = {"batch": batch, "clients": clients}
        found[cell_name(batch, clients)] = summary
        print(json.dumps({"cell": cell_name(batch, clients),
                          "img_s": summary["images_per_s"]}), flush=True)  # fmt: skip
    return found


#: A system's clients: its URL -> one client per set of batches.
Client = Callable[[str], Callable[[Batches], Any]]


def system(name: str, export_dir: Path, work: Path, limits: Limits,
           env: dict[str, str] | None = None,
           cells: tuple[tuple[int, int], ...] = CELLS) -> dict[str, Any]:  # fmt: skip
    """Start one system, measure every cell, stop it."""
    if name == "infinity":
        server = infinity(work)
        make: Client = lambda url: lambda b: InfinityClient(url, b)  # noqa: E731
    else:
        profile, env = plan_env(name.removeprefix("gateway-"), env or {})
        server = gateway(profile, export_dir, work, env)
        make = lambda url: lambda b: GatewayClient(url, b)  # noqa: E731
    # the machine quiet before this system starts (its own idle threads are its business)
    quiet = wait_quiet(limits.quiet_wait_s)
    with server as url:
        chose = _noted(url, "profile_choice") if name == "gateway-auto" else None
        planned = _noted(url, "core_plan") if name != "infinity" else None
        started = time.monotonic()
        cells_found = asyncio.run(measure(make(url), limits, cells))
    found = {"before": quiet, "seconds": round(time.monotonic() - started, 1),
             "env": env or {}, "cells": cells_found}  # fmt: skip
    if chose is not None:
        found["profile_choice"] = chose
    if planned is not None:
        found["core_plan"] = planned
    return found


def plan_env(name: str, env: dict[str, str]) -> tuple[str, dict[str, str]]:
    """``PROFILE@IxT`` (e.g. ``cpu-int8@1x2``): the profile with its core plan fixed by
    settings, I model instances x T threads; a plain profile name: its plan as the launcher
    makes it."""
    profile, _, plan = name.partition("@")
    if not plan:
        return profile, env
    instances, threads = plan.split("x")
    return profile, env | {"GATEWAY_TRITON_INSTANCE_COUNT": instances,
                           "GATEWAY_TRITON_CPU_THREADS": threads}  # fmt: skip


def switched(url: str, timeout_s: float, *, auto: bool = True) -> None:
    """Wait until what serves is what was chosen: ``auto``'s profile (each tower's /v1/models
    entry names the choice) and a CPU profile's core plan (no longer the table's until measured);
    at once where both were recorded here earlier. A GPU's profile is chosen before ready: a
    ready model whose towers name no core plan is served on a GPU."""
    deadline = time.monotonic() + timeout_s
    while True:
        (card,) = httpx.get(f"{url}/v1/models", timeout=30).json()["data"]
        towers = list((card.get("quantization") or {}).values())
        on_gpu = card["ready"] and not any("core_plan" in tower for tower in towers)
        chosen = not auto or (towers and all("profile_choice" in tower for tower in towers))
        planning = any("until measured" in tower.get("core_plan", {}).get("by", "")
                       for tower in towers)  # fmt: skip
        if on_gpu or (chosen and not planning):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the choice was not serving within {timeout_s:g} s")
        time.sleep(2)


def _noted(url: str, key: str) -> dict[str, Any] | None:
    """What the image model's /v1/models entry notes under ``key``: ``core_plan`` (the CPU
    profile's plan and what chose it) or ``profile_choice`` (what ``auto`` measured and chose)."""
    for model in httpx.get(f"{url}/v1/models", timeout=30).json()["data"]:
        image = (model.get("quantization") or {}).get("image") or {}
        if key in image:
            noted: dict[str, Any] = image[key]
            return noted
    return None
