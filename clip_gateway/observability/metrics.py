"""Prometheus metrics of one app, on its own registry (or the multiprocess files, with workers)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.openmetrics import exposition as openmetrics

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
DECODE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
#: Shares of a request's decode budget (the meter's: 3x its price by default, so 1/3 is the
#: price itself).
BUDGET_BUCKETS = (0.05, 0.1, 0.2, 1 / 3, 0.5, 0.75, 1.0, 2.0)


def multiprocess_dir() -> str | None:
    """Set (by the supervisor) when uvicorn workers share /metrics through files."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR")


def forget_dead_workers(directory: str, alive: Callable[[int], bool]) -> list[int]:
    """Remove the live gauges (in-flight images, backlog) of workers that died without
    stopping, so a replaced worker's last values are not summed for ever; their counters stay.
    ``alive`` says whether a process id is still running (the caller's: backend/shm.py's).
    Returns the process ids forgotten."""
    dead = set()
    for path in Path(directory).glob("gauge_live*_*.db"):
        owner = path.stem.rsplit("_", 1)[-1]
        if owner.isdigit() and int(owner) != os.getpid() and not alive(int(owner)):
            dead.add(int(owner))
    for pid in dead:
        multiprocess.mark_process_dead(pid, directory)  # type: ignore[no-untyped-call]
    return sorted(dead)


class Metrics:
    """Every metric the gateway exports. Names follow Prometheus conventions
    (docs/OBSERVABILITY.md lists them)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "gateway_requests", "HTTP requests", ["route", "method", "status"], registry=r
        )
        self.request_seconds = Histogram(
            "gateway_request_duration_seconds",
            "HTTP request latency (exemplar: trace id)",
            ["route", "method", "status"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.images = Counter(
            "gateway_images", "Images decoded and embedded", ["format"], registry=r
        )
        self.texts = Counter("gateway_texts", "Texts tokenised and embedded", registry=r)
        self.tokenize_seconds = Histogram(
            "gateway_tokenize_seconds",
            "Tokenising one request's texts in a worker thread",
            buckets=DECODE_BUCKETS,
            registry=r,
        )
        self.decode_seconds = Histogram(
            "gateway_image_decode_seconds",
            "Decode + preprocess time of one image in a worker thread",
            ["format"],
            buckets=DECODE_BUCKETS,
            registry=r,
        )
        self.decode_budget_used = Histogram(
            "gateway_decode_budget_used",
            "Share of its decode budget a request's image decodes spent (thread CPU seconds over "
            "the decode meter's budget; over 1: stopped)",
            buckets=BUDGET_BUCKETS,
            registry=r,
        )
        self.triton_seconds = Histogram(
            "gateway_triton_request_duration_seconds",
            "One gRPC inference call to Triton",
            ["model", "outcome"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.triton_batch = Histogram(
            "gateway_triton_batch_size",
            "Items per gRPC inference call",
            ["model"],
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.inflight = Gauge(
            "gateway_inflight_items",
            "Items (images and texts) admitted and not yet answered",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.backlog_seconds = Gauge(
            "gateway_admission_backlog_seconds",
            "Estimated seconds of work admitted and not yet answered",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.infer_seconds_per_image = Gauge(
            "gateway_admission_infer_seconds_per_image",
            "Measured backend busy seconds per image (the service rate admission uses)",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.decode_rate = Gauge(
            "gateway_admission_decode_rate",
            "Measured decode seconds per second of header price, per coding (1 = the factors; from "
            "this machine's measured decode speed on)",
            ["format"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.cache_lookups = Counter(
            "gateway_cache_lookups",
            "Embedding cache lookups, by item kind and outcome (hit: no decode, no model call)",
            ["kind", "outcome"],
            registry=r,
        )
        self.rejected = Counter(
            "gateway_rejected_requests", "Requests answered with an error", ["reason"], registry=r
        )

    def render(self, openmetrics_format: bool) -> tuple[bytes, str]:
        """Exposition text; OpenMetrics carries the exemplars (single-process mode only)."""
        registry = self.registry
        if multiprocess_dir():
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        if openmetrics_format:
            body = openmetrics.generate_latest(registry)  # type: ignore[no-untyped-call]
            return body, str(openmetrics.CONTENT_TYPE_LATEST)
        return generate_latest(registry), CONTENT_TYPE_LATEST
