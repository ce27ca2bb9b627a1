"""``python -m bench texts``: text embeddings through the real stack (Triton cpu profile, both
towers, and the gateway): throughput and latency at batch 1 and 32, one and four clients back to
back, and mixed requests (16 images + 16 texts), with images-only requests of the same size
beside them for scale.

Every answer is checked against the embedding the same request got on an idle gateway, so a
row that comes back from the wrong tower or in the wrong place fails the run. Loopback only,
bounded in time.
"""

from __future__ import annotations

import asyncio
import platform
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.harness import load, study
from bench.harness.clients import _TIMING
from bench.harness.load import Reply
from bench.harness.output import write_results
from bench.harness.photos import compact_jpeg
from bench.harness.stack import running
from clip_gateway.client.core import retry_after

#: Words the generated queries are made of: search queries as people type them.
_WORDS = (
    "a photo of the dog cat beach sunset mountain city street night red blue green old small "
    "large two people children playing snow forest river car bicycle on in at with under near "
    "café São Paulo 東京 🐕 birthday party wedding dinner table window kitchen garden"
)


def queries(count: int, seed: int = 0) -> list[str]:
    rng, words = random.Random(seed), _WORDS.split()
    return [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) for _ in range(count)]


@dataclass
class Cell:
    """One request shape: ``texts`` and ``images`` per request, in the order they are sent."""

    name: str
    texts: int
    images: int


CELLS = (
    Cell("text x1", 1, 0),
    Cell("text x32", 32, 0),
    Cell("mixed 16+16", 16, 16),
    Cell("image x32", 0, 32),
)


@dataclass
class Requests:
    """Distinct request bodies of one cell (multipart: ``text`` fields and image files
    interleaved), and the vectors each got on an idle gateway."""

    cell: Cell
    bodies: list[tuple[bytes, str]]
    expected: list[np.ndarray] = field(default_factory=list)


def build(cell: Cell, variants: int, seed: int) -> Requests:
    bodies = []
    for v in range(variants):
        texts = queries(cell.texts, seed * 1000 + v)
        images = [compact_jpeg(5000 + seed * 100 + v * 40 + i) for i in range(cell.images)]
        request = httpx.Request(
            "POST", "http://bench/v1/embeddings", files=_interleave(texts, images)
        )
        bodies.append((request.read(), request.headers["content-type"]))
    return Requests(cell, bodies)


def _interleave(texts: list[str], images: list[bytes]) -> list[tuple[str, Any]]:
    form: list[tuple[str, Any]] = []
    for i in range(max(len(texts), len(images))):
        if i < len(texts):
            form.append(("text", (None, texts[i].encode(), "text/plain; charset=utf-8")))
        if i < len(images):
            form.append(("image", (f"{i}.jpg", images[i], "image/jpeg")))
    return form


class Caller:
    def __init__(self, url: str, requests: Requests) -> None:
        self.requests = requests
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        self.http = httpx.AsyncClient(base_url=url, timeout=120, limits=limits)

    async def vectors(self, slot: int) -> tuple[int, np.ndarray | None, dict[str, float]]:
        body, content_type = self.requests.bodies[slot]
        response = await self.http.post(
            "/v1/embeddings",
            content=body,
            headers={"Content-Type": content_type, "Accept": "application/octet-stream"},
        )
        if response.status_code == 429:  # admission: a client waits as it is told (at most
            # 2 s), then retries: its next request, counted as such
            await asyncio.sleep(min(retry_after(response) or 1.0, 2.0))
        if response.status_code != 200:
            return response.status_code, None, {}
        rows, dim = map(int, response.headers["x-embedding-shape"].split(","))
        timing = {k: float(v) for k, v in _TIMING.findall(response.headers["server-timing"])}
        return 200, np.frombuffer(response.content, "<f4").reshape(rows, dim), timing

    async def __call__(self, index: int) -> Reply:
        slot = index % len(self.requests.bodies)
        status, got, timing = await self.vectors(slot)
        cell = self.requests.cell
        items = cell.texts + cell.images
        if got is None:
            return Reply(status, 0)
        expected = self.requests.expected[slot]
        correct = got.shape == expected.shape and bool(np.abs(got - expected).max() < 1e-4)
        return Reply(200, items, len(self.requests.bodies[slot][0]), len(got) * 4, correct, timing)

    async def close(self) -> None:
        await self.http.aclose()


def run(seconds: float, out: Path, smoke: bool = False) -> dict[str, Any]:
    duration = 2.0 if smoke else seconds
    results: dict[str, Any] = {
        "machine": {"cpus": _cpus(), "processor": platform.processor() or platform.machine()},
        "seconds_per_cell": duration,
        "cells": [],
    }
    with running() as stack:
        for index, cell in enumerate(CELLS):
            requests = build(cell, variants=2 if smoke else 8, seed=index)
            caller = Caller(stack.gateway.url, requests)

            async def measure(caller: Caller = caller, requests: Requests = requests) -> list[Any]:
                try:
                    for slot in range(len(requests.bodies)):  # idle answers: the reference
                        status, got, _ = await caller.vectors(slot)
                        assert status == 200 and got is not None, status
                        requests.expected.append(got.copy())
                    found = []
                    for concurrency in (1, 4):
                        records = await load.closed_loop(caller, concurrency, duration=duration)
                        found.append((concurrency, records))
                    return found
                finally:
                    await caller.close()

            for concurrency, records in asyncio.run(measure()):
                summary = load.summarize(records)
                summary["items_per_s"] = summary.pop("images_per_s")
                timings = [r.reply.server_ms for r in records if r.reply.server_ms]
                summary["server_ms_mean"] = {
                    key: round(float(np.mean([t.get(key, 0.0) for t in timings])), 2)
                    for key in ("decode", "tokenize", "infer")
                } if timings else {}  # fmt: skip
                shape = {"cell": cell.name, "texts": cell.texts, "images": cell.images}
                results["cells"].append({**shape, "concurrency": concurrency, **summary})
    results["wrong"] = sum(int(c["wrong"]) for c in results["cells"])
    results["unexpected_5xx"] = sum(
        n for c in results["cells"] for s, n in c["statuses"].items() if s.startswith("5")
    )
    write_results(out, "texts", results, markdown=markdown(results))
    return results


def markdown(results: dict[str, Any]) -> str:
    lines = [
        "# Text embeddings through the real stack (cpu profile, ViT-B-32, random weights)",
        "",
        f"{results['machine']['cpus']} CPUs; {results['seconds_per_cell']:g} s per cell, closed "
        "loop; every answer checked against the idle gateway's.",
        "",
        "| request | clients | items/s | requests/s | p50 ms | p95 ms | tokenize ms | infer ms "
        "| wrong |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in results["cells"]:
        latency, server = c.get("latency_ms", {}), c.get("server_ms_mean", {})
        lines.append(
            f"| {c['cell']} | {c['concurrency']} | {c['items_per_s']} | {c['requests_per_s']} "
            f"| {latency.get('p50', '-')} | {latency.get('p95', '-')} "
            f"| {server.get('tokenize', '-')} | {server.get('infer', '-')} | {c['wrong']} |"
        )
    return "\n".join(lines) + "\n"


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0))


def main(argv: list[str]) -> int:
    parser = study.parser("texts", __doc__, smoke="seconds, for CI")
    parser.add_argument("--seconds", type=float, default=20.0, help="per cell and concurrency")
    args = parser.parse_args(argv)
    out = study.out(args, "texts")
    return study.checked(out, run(args.seconds, out, args.smoke))
