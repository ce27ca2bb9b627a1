"""Drive one system through a plan of load phases; one process per system.

``python -m bench.harness.drive PLAN.json OUT.json``. Running each system's client in its own
process lets baselines use stock Pillow (put first on PYTHONPATH by the runner) while ours uses
pillow-simd, and keeps one system's client work from slowing another's. Around every phase the
driver diffs Triton's Prometheus counters, so the server-side time is accounted for.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from bench.harness import load
from bench.harness.clients import Batches, GatewayClient, PytorchClient, TritonRawClient
from bench.harness.photos import compact_jpeg

TRITON_COUNTERS = (
    "nv_inference_request_success",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
)


def triton_counters(url: str | None, model: str) -> dict[str, float]:
    if not url:
        return {}
    text = httpx.get(url, timeout=10).text
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")  # the parser suffixes counters
            if name in TRITON_COUNTERS and sample.labels.get("model") == model:
                totals[name] = totals.get(name, 0.0) + sample.value
    return totals


def breakdown(before: dict[str, float], after: dict[str, float]) -> dict[str, float] | None:
    """Per-request server-side milliseconds from Triton's counters, and the mean batch formed."""
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in TRITON_COUNTERS}
    requests = delta["nv_inference_request_success"]
    if requests <= 0:
        return None
    per = {
        name: round(delta[f"nv_inference_{name}_duration_us"] / requests / 1000, 3)
        for name in ("queue", "compute_input", "compute_infer", "compute_output")
    }
    executions = delta["nv_inference_exec_count"]
    per["triton_requests"] = requests
    per["mean_batch_executed"] = (
        round(delta["nv_inference_count"] / executions, 2) if executions else 0
    )
    return per


def make_client(plan: dict[str, Any], batches: Batches) -> Any:
    system = plan["system"]
    if system in ("gateway", "gateway-json"):
        return GatewayClient(plan["url"], batches, binary=system == "gateway")
    if system == "pytorch":
        return PytorchClient(plan["url"], batches)
    if system in ("triton-grpc", "triton-http"):
        return TritonRawClient(plan["url"], batches, protocol=system.removeprefix("triton-"))
    raise ValueError(f"unknown system {system}")


async def run_phase(client: Any, phase: dict[str, Any], plan: dict[str, Any]) -> dict[str, Any]:
    model = plan.get("triton_model", "clip_image")
    for i in range(phase.get("warmup", 0)):  # excluded from every figure, server-side ones too
        await client(-1 - i)
    before = triton_counters(plan.get("triton_metrics_url"), model)
    if phase.get("mode", "closed") == "open":
        records = await load.open_loop(client, phase["rate"], phase["duration"])
    else:
        records = await load.closed_loop(
            client,
            phase.get("concurrency", 1),
            count=phase.get("count"),
            duration=phase.get("duration"),
        )
    after = triton_counters(plan.get("triton_metrics_url"), model)
    summary = load.summarize(records)
    server = [r.reply.server_ms for r in records if r.reply.server_ms]
    if server:
        summary["gateway_ms"] = {
            key: round(float(np.mean([s[key] for s in server if key in s])), 3)
            for key in sorted({k for s in server for k in s})
        }
    summary["triton"] = breakdown(before, after)
    summary["phase"] = phase
    return summary


async def drive(plan: dict[str, Any]) -> dict[str, Any]:
    pool = [compact_jpeg(seed) for seed in range(plan.get("distinct_images", 64))]
    results: dict[str, Any] = {"system": plan["system"], "phases": {}}
    clients: dict[int, Any] = {}
    try:
        for phase in plan["phases"]:
            batch = phase.get("batch", 1)
            if batch not in clients:
                batches = Batches(
                    [[pool[(i * batch + j) % len(pool)] for j in range(batch)] for i in range(16)]
                )
                clients[batch] = make_client(plan, batches)
            results["phases"][phase["name"]] = await run_phase(clients[batch], phase, plan)
            print(json.dumps({"system": plan["system"], "phase": phase["name"]}), flush=True)
    finally:
        for client in clients.values():
            await client.close()
    return results


def main() -> int:
    plan = json.loads(Path(sys.argv[1]).read_text())
    result = asyncio.run(drive(plan))
    Path(sys.argv[2]).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
