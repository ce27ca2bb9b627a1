"""The real stack for the reliability runs: export (cached) → Triton (cpu profile) → gateway."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.harness.clients import Batches, GatewayClient
from bench.harness.models import export, render
from bench.harness.photos import CAMERA_SIZES, compact_jpeg, jpeg, photo
from clip_gateway.config.processes import GatewayProcess
from clip_gateway.launcher.local import LocalTriton


@dataclass
class Stack:
    triton: LocalTriton
    gateway: GatewayProcess
    work: Path


@contextlib.contextmanager
def running(gateway_env: dict[str, str] | None = None) -> Iterator[Stack]:
    exported = export()
    with tempfile.TemporaryDirectory(prefix="bench-stack-") as tmp:
        work = Path(tmp)
        repo = render(exported, work / "repo", "cpu")
        with LocalTriton(repo, log_path=work / "triton.log") as triton:
            gateway = GatewayProcess(
                triton.grpc_url,
                triton_http_url=triton.http_url,
                env={"GATEWAY_TRITON_METRICS_URL": triton.metrics_url, **(gateway_env or {})},
                log_path=work / "gateway.log",
            )
            with gateway:
                gateway.wait_ready()
                yield Stack(triton, gateway, work)


def camera_photos(count: int) -> list[bytes]:
    """Full-size camera JPEGs, 8-24 MP, every other one progressive (what phones upload)."""
    sizes = [CAMERA_SIZES[mp] for mp in (8, 12, 16, 24)]
    return [jpeg(photo(*sizes[i % 4], seed=2000 + i), progressive=i % 2 == 1) for i in range(count)]


def reference_batches(
    url: str, images: int, batch: int, pool: list[bytes] | None = None
) -> Batches:
    """Distinct JPEGs (compact ones unless ``pool`` is given) and, for each batch, the
    embeddings the gateway gives unloaded: under load every answer is checked against them, so
    a mixed-up response cannot hide."""
    pool = pool or [compact_jpeg(1000 + i) for i in range(images)]
    batches = [[pool[(i * batch + j) % len(pool)] for j in range(batch)] for i in range(images)]
    plain = Batches(batches)

    async def collect() -> list[np.ndarray]:
        client = GatewayClient(url, plain)
        try:
            expected = []
            for i in range(len(batches)):
                reply = await _vectors(client, i)
                expected.append(reply)
            return expected
        finally:
            await client.close()

    return Batches(batches, asyncio.run(collect()))


async def _vectors(client: GatewayClient, index: int) -> np.ndarray:
    body, content_type = client.bodies[index]
    response = await client.http.post(
        "/v1/embeddings",
        content=body,
        headers={"Content-Type": content_type, "Accept": "application/octet-stream"},
    )
    response.raise_for_status()
    rows, dim = map(int, response.headers["x-embedding-shape"].split(","))
    return np.frombuffer(response.content, "<f4").reshape(rows, dim).copy()
