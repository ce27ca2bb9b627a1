"""Triton's side of the hop, measured from outside: the CPU its process tree spends (the server
itself, and the Python-backend stubs it starts as its children), and what the served model's
counters on Triton's /metrics say over the same cell (executions, rows per execution, input bytes
triton/python/model.py copied into its batch buffer, whether that buffer is page-locked)."""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench.harness.cpu import own_and_descendants

#: Triton's cumulative microseconds per successful request, by stage: what a request spent in
#: all, waiting in the dynamic batcher's queue, and in its execution's input, infer and output.
#: An execution's durations are counted for each request it served.
DURATIONS = {"request": "nv_inference_request_duration_us",
             "queue": "nv_inference_queue_duration_us",
             "input": "nv_inference_compute_input_duration_us",
             "infer": "nv_inference_compute_infer_duration_us",
             "output": "nv_inference_compute_output_duration_us"}  # fmt: skip
#: Triton's own counters (rows inferred, executions, requests served and their durations) and
#: triton/python/model.py's.
COUNTERS = ("nv_inference_count", "nv_inference_exec_count", "nv_inference_request_success",
            *DURATIONS.values(), "clip_batch_copied_bytes")  # fmt: skip
PINNED = "clip_batch_buffer_pinned"
#: triton/python/model.py's: 1 when the CUDA EP's context waits for the GPU asleep (blocking sync).
BLOCKING = "clip_cuda_blocking_sync"
GAUGES = (PINNED, BLOCKING)


@dataclass(frozen=True)
class Snapshot:
    server_s: float
    stubs_s: float
    #: The model's series summed over its instances; a name Triton did not report is absent.
    metrics: dict[str, float]


def model_metrics(metrics_url: str, model: str) -> dict[str, float]:
    """``COUNTERS`` and ``GAUGES`` for ``model`` (counters summed over versions and instances;
    a gauge: the smallest instance's value, 1 only if all say so)."""
    try:
        with urllib.request.urlopen(metrics_url, timeout=10) as response:
            text = response.read().decode()
    except (OSError, urllib.error.URLError):
        return {}
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("model") != model:
                continue
            name = sample.name.removesuffix("_total")
            if name in COUNTERS:
                found[name] = found.get(name, 0.0) + sample.value
            elif name in GAUGES:
                found[name] = min(found.get(name, sample.value), sample.value)
    return found


@dataclass(frozen=True)
class TritonSide:
    """A running tritonserver (``pid``, reached at ``grpc_url``, its inference calls at
    ``http_url``) serving ``model``, whose input rows are ``row_bytes``."""

    pid: int
    metrics_url: str
    model: str
    row_bytes: int
    grpc_url: str = ""
    http_url: str = ""

    def snapshot(self) -> Snapshot:
        server, stubs = own_and_descendants(self.pid)
        return Snapshot(server, stubs, model_metrics(self.metrics_url, self.model))

    def since(self, before: Snapshot, items: int) -> dict[str, Any]:
        """Triton's figures for the ``items`` served since ``before``: CPU per item (all of
        it, the server's, the stubs'), executions and rows per execution, milliseconds per
        request by stage (where the time between the gateway's call and its answer went),
        copies per row."""
        now = self.snapshot()
        server, stubs = now.server_s - before.server_s, now.stubs_s - before.stubs_s

        def per_item(seconds: float) -> float | None:
            return round(1e6 * seconds / items, 1) if items else None

        found: dict[str, Any] = {
            "triton_cpu_s": round(server + stubs, 2),
            "triton_cpu_us_per_item": per_item(server + stubs),
            "triton_server_cpu_us_per_item": per_item(server),
            "triton_stub_cpu_us_per_item": per_item(stubs),
        }
        delta = {name: now.metrics[name] - before.metrics.get(name, 0.0)
                 for name in COUNTERS if name in now.metrics}  # fmt: skip
        rows, executions = delta.get("nv_inference_count"), delta.get("nv_inference_exec_count")
        if executions:
            found["triton_executions"] = int(executions)
            found["triton_rows_per_execution"] = round((rows or 0) / executions, 1)
        if requests := delta.get("nv_inference_request_success"):
            found["triton_ms_per_request"] = {stage: round(delta[name] / requests / 1000, 2)
                                              for stage, name in DURATIONS.items()
                                              if name in delta}  # fmt: skip
        if rows and "clip_batch_copied_bytes" in delta:
            copies = delta["clip_batch_copied_bytes"] / (rows * self.row_bytes)
            found["triton_copies_per_row"] = round(copies, 3)
        if PINNED in now.metrics:
            found["triton_buffer_pinned"] = bool(now.metrics[PINNED])
        if BLOCKING in now.metrics:
            found["triton_blocking_sync"] = bool(now.metrics[BLOCKING])
        return found
