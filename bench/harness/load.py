"""Async load generator: closed loop (N clients back to back) or open loop (a fixed arrival rate),
always bounded by a request count and/or a duration. Loopback only; measures what the client sees.

A *call* is an async function doing one complete request, from bytes in hand to embeddings in
hand, and returning a :class:`Reply`. Everything else (which system, which protocol) lives in
the call, so the same generator drives the gateway, the peers, overload and soak runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Reply:
    status: int
    images: int
    sent_bytes: int = 0
    received_bytes: int = 0
    #: None: not checked; False: the embeddings did not match the images sent
    correct: bool | None = None
    #: server-reported milliseconds (e.g. the gateway's Server-Timing decode)
    server_ms: dict[str, float] | None = None


@dataclass(frozen=True)
class Record:
    start: float  # seconds since the run started
    latency: float  # seconds
    reply: Reply


Call = Callable[[int], Awaitable[Reply]]


async def closed_loop(
    call: Call,
    concurrency: int,
    *,
    count: int | None = None,
    duration: float | None = None,
    warmup: int = 0,
) -> list[Record]:
    """``concurrency`` clients, each sending its next request as soon as the last returns."""
    if count is None and duration is None:
        raise ValueError("bound the run by count, duration or both")
    for i in range(warmup):
        await call(-1 - i)
    records: list[Record] = []
    started = time.perf_counter()
    issued = 0

    def more() -> bool:
        in_time = duration is None or time.perf_counter() - started < duration
        return in_time and (count is None or issued < count)

    async def client() -> None:
        nonlocal issued
        while more():
            index = issued
            issued += 1
            t0 = time.perf_counter()
            reply = await call(index)
            records.append(Record(t0 - started, time.perf_counter() - t0, reply))

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return records


async def open_loop(
    call: Call, rate: float, duration: float, *, max_outstanding: int = 10_000
) -> list[Record]:
    """Requests arrive at ``rate`` per second whatever the server does (overload testing).

    Arrivals beyond ``max_outstanding`` unanswered requests are counted as client-side drops
    (status 0) rather than queued, so the generator itself never grows without bound.
    """
    records: list[Record] = []
    started = time.perf_counter()
    tasks: set[asyncio.Task[None]] = set()

    async def one(index: int, t0: float) -> None:
        reply = await call(index)
        records.append(Record(t0 - started, time.perf_counter() - t0, reply))

    index = 0
    while (now := time.perf_counter()) - started < duration:
        due = started + index / rate
        if due > now:
            await asyncio.sleep(due - now)
        if len(tasks) >= max_outstanding:
            records.append(Record(due - started, 0.0, Reply(0, 0)))
        else:
            task = asyncio.create_task(one(index, time.perf_counter()))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        index += 1
    await asyncio.gather(*tasks)
    return records


def summarize(records: list[Record], *, elapsed: float | None = None) -> dict[str, object]:
    """Counts by status, throughput and latency percentiles of the successful requests."""
    ok = [r for r in records if r.reply.status == 200]
    statuses: dict[str, int] = {}
    for r in records:
        statuses[str(r.reply.status)] = statuses.get(str(r.reply.status), 0) + 1
    if elapsed is None:
        elapsed = max((r.start + r.latency for r in records), default=0.0)
    latencies = np.array([r.latency for r in ok]) * 1000
    images = sum(r.reply.images for r in ok)
    summary: dict[str, object] = {
        "requests": len(records),
        "ok": len(ok),
        "statuses": statuses,
        "wrong": sum(1 for r in records if r.reply.correct is False),
        "seconds": round(elapsed, 3),
        "images_per_s": round(images / elapsed, 2) if elapsed else 0.0,
        "requests_per_s": round(len(ok) / elapsed, 2) if elapsed else 0.0,
    }
    if len(latencies):
        summary["latency_ms"] = {
            "mean": round(float(latencies.mean()), 2),
            "p50": round(float(np.percentile(latencies, 50)), 2),
            "p95": round(float(np.percentile(latencies, 95)), 2),
            "p99": round(float(np.percentile(latencies, 99)), 2),
            "max": round(float(latencies.max()), 2),
        }
        sent = [r.reply.sent_bytes / r.reply.images for r in ok if r.reply.images]
        summary["sent_bytes_per_image"] = round(float(np.mean(sent)), 1) if sent else None
    rejected = [r.latency * 1000 for r in records if r.reply.status not in (200, 0)]
    if rejected:
        summary["rejected_latency_ms_p95"] = round(float(np.percentile(rejected, 95)), 2)
        summary["rejected_latency_ms_p99"] = round(float(np.percentile(rejected, 99)), 2)
    return summary
