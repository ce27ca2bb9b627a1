"""``python -m bench immich``: Immich-shaped load on the real stack (Triton cpu profile,
ViT-B-32 random weights, the gateway with ``GATEWAY_IMMICH``): one preview per request, as
Immich's smart-search job sends them, at 1, 8 and 32 concurrent requests, against ``/predict``
and against ``/v1/embeddings`` with the same previews, back to back (``/predict`` first, then
``/v1/embeddings``, then the two again in the other order, so drift in a shared machine's load
falls on both). Triton's counters say how many requests its dynamic batcher merged per
execution. Every answer is checked against what that route gave the same preview on an idle
gateway. Loopback only, bounded in time.

The one-URL setup (docs/IMMICH.md) is what runs: the gateway has Immich's ML server behind
it (``GATEWAY_IMMICH_UPSTREAM``, the stand-in process of tests/immich_upstream.py), so every
``/predict`` row includes reading the form's ``entries`` to decide where it goes; the last row
is CLIP on ``/predict`` with face requests forwarded beside it (``FACE_CLIENTS`` more clients),
each forwarded answer checked byte for byte against the stand-in's.

``/predict`` decodes every pixel (Immich's transform, for Immich's embeddings);
``/v1/embeddings`` decodes JPEGs at the DCT scale the resize needs: on a CPU-bound machine that
decode is the difference between the two.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.harness import load
from bench.harness.drive import breakdown, triton_counters
from bench.harness.load import Reply
from bench.harness.output import figure, write_results
from bench.harness.photos import immich_previews
from bench.harness.stack import running
from clip_gateway.client.core import retry_after
from tests.immich_upstream import UpstreamProcess
from tests.immich_upstream import answer as upstream_answer

NAME = "ViT-B-32__openai"
CONCURRENCY = (1, 8, 32)
ROUTES = ("predict", "embeddings")
#: The one-URL row: CLIP clients on /predict, and face-detection clients beside them.
ONE_URL_CONCURRENCY = 8
FACE_CLIENTS = 4
FACES = {"facial-recognition": {"detection": {"modelName": "buffalo_l",
                                              "options": {"minScore": 0.7}},
                                "recognition": {"modelName": "buffalo_l"}}}  # fmt: skip


@dataclass
class Route:
    """One route's request bodies (one per preview) and the idle answers to check against."""

    name: str
    bodies: list[tuple[bytes, str]]
    expected: list[np.ndarray]


def bodies(route: str, previews: list[bytes]) -> list[tuple[bytes, str]]:
    out = []
    for data in previews:
        if route == "predict":  # as Immich's server builds it: entries, then an unnamed Blob
            entries = json.dumps({"clip": {"visual": {"modelName": NAME}}})
            files: list[Any] = [("entries", (None, entries)),
                                ("image", ("blob", data, "application/octet-stream"))]  # fmt: skip
            url = "http://bench/predict"
        else:
            files, url = (
                [("image", ("preview.jpg", data, "image/jpeg"))],
                "http://bench/v1/embeddings",
            )
        request = httpx.Request("POST", url, files=files)
        out.append((request.read(), request.headers["content-type"]))
    return out


class Caller:
    def __init__(self, url: str, route: Route) -> None:
        self.route = route
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        self.http = httpx.AsyncClient(base_url=url, timeout=120, limits=limits)

    async def vector(self, slot: int) -> tuple[int, np.ndarray | None]:
        body, content_type = self.route.bodies[slot]
        path = "/predict" if self.route.name == "predict" else "/v1/embeddings"
        response = await self.http.post(path, content=body, headers={"Content-Type": content_type})
        if response.status_code == 429:  # admission: a client waits as it is told (at most 2 s:
            # a closed loop's next request is its retry, counted as such)
            await asyncio.sleep(min(retry_after(response) or 1.0, 2.0))
        if response.status_code != 200:
            return response.status_code, None
        answer = response.json()
        if self.route.name == "predict":
            return 200, np.array(json.loads(answer["clip"]), dtype=np.float32)
        return 200, np.array(answer["data"][0]["embedding"], dtype=np.float32)

    async def __call__(self, index: int) -> Reply:
        slot = index % len(self.route.bodies)
        status, got = await self.vector(slot)
        if got is None:
            return Reply(status, 0)
        expected = self.route.expected[slot]
        correct = got.shape == expected.shape and bool(np.abs(got - expected).max() < 1e-4)
        return Reply(200, 1, len(self.route.bodies[slot][0]), 0, correct)

    async def close(self) -> None:
        await self.http.aclose()


class FaceCaller:
    """Immich's face-detection requests, forwarded by the gateway; each answer checked against
    the bytes the stand-in upstream gives for that preview."""

    def __init__(self, url: str, previews: list[bytes]) -> None:
        self.previews = previews
        self.bodies = []
        for data in previews:
            files: list[tuple[str, Any]] = [("entries", (None, json.dumps(FACES))),
                     ("image", ("blob", data, "application/octet-stream"))]  # fmt: skip
            request = httpx.Request("POST", "http://bench/predict", files=files)
            self.bodies.append((request.read(), request.headers["content-type"]))
        self.expected = [upstream_answer(FACES, data, None) for data in previews]
        self.http = httpx.AsyncClient(base_url=url, timeout=120)

    async def __call__(self, index: int) -> Reply:
        slot = index % len(self.bodies)
        body, content_type = self.bodies[slot]
        response = await self.http.post("/predict", content=body,
                                        headers={"Content-Type": content_type})  # fmt: skip
        if response.status_code != 200:
            return Reply(response.status_code, 0)
        return Reply(200, 1, len(body), len(response.content),
                     response.content == self.expected[slot])  # fmt: skip

    async def close(self) -> None:
        await self.http.aclose()


def run(seconds: float, out: Path, smoke: bool = False, previews: int = 24) -> dict[str, Any]:
    half = 1.0 if smoke else seconds / 2
    images = [s.data for s in immich_previews(4 if smoke else previews)]
    results: dict[str, Any] = {
        "machine": {"cpus": len(os.sched_getaffinity(0)),
                    "processor": platform.processor() or platform.machine()},
        "seconds_per_cell": half * 2,
        "previews": len(images),
        "preview_bytes_mean": int(np.mean([len(d) for d in images])),
        "cells": [],
    }  # fmt: skip
    upstream = UpstreamProcess()
    with upstream:
        results["cells"] = _measure(upstream, images, half)
    return _finish(results, out)


def _measure(upstream: UpstreamProcess, images: list[bytes], half: float) -> list[dict[str, Any]]:
    env = {"GATEWAY_IMMICH": "true", "GATEWAY_IMMICH_ALIASES": NAME,
           "GATEWAY_IMMICH_UPSTREAM": upstream.url}  # fmt: skip
    with running(env) as stack:
        url, metrics = stack.gateway.url, stack.triton.metrics_url
        routes = {name: Route(name, bodies(name, images), []) for name in ROUTES}

        async def measure() -> list[dict[str, Any]]:
            callers = {name: Caller(url, route) for name, route in routes.items()}
            faces = FaceCaller(url, images)
            try:
                for name, caller in callers.items():  # idle answers: the reference
                    for slot in range(len(images)):
                        status, got = await caller.vector(slot)
                        assert status == 200 and got is not None, (name, status)
                        routes[name].expected.append(got)
                cells = []
                for concurrency in CONCURRENCY:
                    found: dict[str, list[load.Record]] = {name: [] for name in ROUTES}
                    batches: dict[str, list[dict[str, float]]] = {name: [] for name in ROUTES}
                    for name in (*ROUTES, *reversed(ROUTES)):
                        before = triton_counters(metrics, "clip_image")
                        records = await load.closed_loop(
                            callers[name], concurrency, duration=half, warmup=min(concurrency, 4)
                        )
                        server = breakdown(before, triton_counters(metrics, "clip_image"))
                        found[name].append(records)  # type: ignore[arg-type]
                        if server:
                            batches[name].append(server)
                    for name in ROUTES:
                        cells.append(cell(name, concurrency, found[name], batches[name], half))  # type: ignore[arg-type]
                cells.append(await one_url(callers["predict"], faces, metrics, half * 2))
                return cells
            finally:
                for caller in callers.values():
                    await caller.close()
                await faces.close()

        return asyncio.run(measure())


def _finish(results: dict[str, Any], out: Path) -> dict[str, Any]:
    cells = results["cells"]
    alone = next(
        c for c in cells if (c["route"], c["concurrency"]) == ("predict", ONE_URL_CONCURRENCY)
    )
    beside = results["cells"][-1]
    beside["vs_predict_alone"] = (
        round(beside["images_per_s"] / alone["images_per_s"], 3) if alone["images_per_s"] else None
    )
    for concurrency in CONCURRENCY:
        pair = {c["route"]: c for c in results["cells"] if c["concurrency"] == concurrency
                and c["route"] in ROUTES}  # fmt: skip
        base = pair["embeddings"]["images_per_s"]
        pair["predict"]["vs_embeddings"] = (
            round(pair["predict"]["images_per_s"] / base, 3) if base else None
        )
    results["wrong"] = sum(int(c["wrong"]) for c in results["cells"]) + int(
        beside["faces"]["not_byte_identical"]
    )
    results["unexpected_5xx"] = sum(
        n for c in results["cells"] for s, n in c["statuses"].items() if s.startswith("5")
    )
    write_results(out, "immich", results, markdown=markdown(results), plot=plot)
    return results


async def one_url(clip: Caller, faces: FaceCaller, metrics: str, seconds: float) -> dict[str, Any]:
    """CLIP on /predict at ``ONE_URL_CONCURRENCY`` while ``FACE_CLIENTS`` clients send face
    requests the gateway forwards, for the same time: one row, with the faces' own figures."""
    before = triton_counters(metrics, "clip_image")
    clip_records, face_records = await asyncio.gather(
        load.closed_loop(clip, ONE_URL_CONCURRENCY, duration=seconds, warmup=4),
        load.closed_loop(faces, FACE_CLIENTS, duration=seconds, warmup=2),
    )
    server = breakdown(before, triton_counters(metrics, "clip_image"))
    row = cell("predict + faces forwarded", ONE_URL_CONCURRENCY, [clip_records],
               [server] if server else [], seconds)  # fmt: skip
    ok = [r for r in face_records if r.reply.status == 200]
    statuses: dict[str, int] = {}
    for r in face_records:
        statuses[str(r.reply.status)] = statuses.get(str(r.reply.status), 0) + 1
    row["faces"] = {
        "clients": FACE_CLIENTS,
        "per_s": round(len(ok) / seconds, 2),
        "statuses": statuses,
        "not_byte_identical": sum(1 for r in ok if r.reply.correct is False),
        "p50_ms": round(float(np.percentile([r.latency for r in ok], 50)) * 1000, 1)
        if ok
        else None,
    }
    return row


def cell(
    route: str,
    concurrency: int,
    rounds: list[list[load.Record]],
    server: list[dict[str, float]],
    half: float,
) -> dict[str, Any]:
    """Both rounds of one route at one concurrency, as one row."""
    records = [r for round_ in rounds for r in round_]
    ok = [r for r in records if r.reply.status == 200]
    statuses: dict[str, int] = {}
    for r in records:
        statuses[str(r.reply.status)] = statuses.get(str(r.reply.status), 0) + 1
    latencies = np.array([r.latency for r in ok]) * 1000
    requests = sum(s["triton_requests"] for s in server)
    executions = sum(s["triton_requests"] / s["mean_batch_executed"] for s in server
                     if s["mean_batch_executed"])  # fmt: skip
    return {
        "route": route,
        "concurrency": concurrency,
        "requests": len(records),
        "statuses": statuses,
        "images_per_s": round(len(ok) / (half * len(rounds)), 2),
        "latency_ms": {
            key: round(float(np.percentile(latencies, q)), 1)
            for key, q in (("p50", 50), ("p95", 95), ("p99", 99))
        }
        if len(latencies)
        else {},
        "triton_mean_batch": round(requests / executions, 2) if executions else None,
        "wrong": sum(1 for r in ok if r.reply.correct is False),
    }


def markdown(results: dict[str, Any]) -> str:
    lines = [
        "# Immich-shaped load: `/predict` vs `/v1/embeddings` (cpu profile, ViT-B-32, random "
        "weights)",
        "",
        f"{results['machine']['cpus']} CPUs ({results['machine']['processor']}); "
        f"{results['previews']} Immich previews (mean {results['preview_bytes_mean']} bytes), "
        f"one per request; {results['seconds_per_cell']:g} s per route and concurrency, in two "
        "halves (predict, embeddings, embeddings, predict); closed loop; every answer checked "
        "against the idle answer for that preview.",
        "",
        "| clients | route | images/s | vs /v1/embeddings | p50 ms | p95 ms | Triton mean batch "
        "| statuses | wrong |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in results["cells"]:
        latency = c.get("latency_ms", {})
        lines.append(
            f"| {c['concurrency']} | {c['route']} | {c['images_per_s']} "
            f"| {c.get('vs_embeddings', '-')} | {latency.get('p50', '-')} "
            f"| {latency.get('p95', '-')} | {c['triton_mean_batch']} | {c['statuses']} "
            f"| {c['wrong']} |"
        )
    beside = results["cells"][-1]
    faces = beside["faces"]
    lines += [
        "",
        f"One URL: CLIP at {beside['concurrency']} clients on `/predict` with "
        f"{faces['clients']} face-detection clients beside it, forwarded by the gateway to "
        f"Immich's ML server (a stand-in process on the same machine): CLIP "
        f"{beside['images_per_s']} images/s, {beside.get('vs_predict_alone')} of `/predict` "
        f"alone at {beside['concurrency']} clients; faces {faces['per_s']}/s (p50 "
        f"{faces['p50_ms']} ms, statuses {faces['statuses']}, "
        f"{faces['not_byte_identical']} not byte-identical to the upstream's answer).",
    ]
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], path: Path) -> None:
    with figure(path, dpi=100, ncols=2, figsize=(10, 4)) as (_, (rate, batch)):
        for offset, route in enumerate(ROUTES):
            cells = [c for c in results["cells"] if c["route"] == route][: len(CONCURRENCY)]
            xs = [i + 0.4 * offset for i in range(len(cells))]
            rate.bar(xs, [c["images_per_s"] for c in cells], width=0.4, label=route)
            batch.bar(xs, [c["triton_mean_batch"] or 0 for c in cells], width=0.4, label=route)
        for axis, title in ((rate, "images/s"), (batch, "Triton mean batch per execution")):
            axis.set_xticks(
                [i + 0.2 for i in range(len(CONCURRENCY))], [str(c) for c in CONCURRENCY]
            )
            axis.set_xlabel("concurrent single-image requests")
            axis.set_title(title)
            axis.legend()
