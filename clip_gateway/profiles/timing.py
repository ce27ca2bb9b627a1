"""A profile timed as it would serve, in a tritonserver of its own (the host's ``trial``): what
the gateway sends, from several callers at once, in rounds after a warm-up. Three uses: GPU
calibration's batch mix (``batch_mix``, profiles/calibrate.py), a CPU profile's core plan
(``time_plan``: batch 32 from 4 callers and one image's p50, profiles/planner.py), and each
profile of a choice in turn within its budget (``time_each``)."""

from __future__ import annotations

import asyncio
import logging
import statistics
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from clip_gateway.config.processes import Interrupted
from clip_gateway.config.settings import Profile, RepositorySettings
from clip_gateway.model.contract import TRITON_MODEL_NAME
from clip_gateway.profiles.host import Host
from clip_gateway.profiles.plans import ModelPlan, PlanTiming

log = logging.getLogger(__name__)

#: Calibration: rounds counted after the warm-up round, and requests per caller per round.
MIX_ROUNDS = 3
REQUESTS_PER_CALLER = 8
#: Callers at once for the throughput figure, each sending batches of ``BATCH`` (the issue's
#: reference load, as ``auto``'s profile timing).
CALLERS = 4
BATCH = 32
#: Counted throughput rounds after a warm-up round, at most (at least two, however short the
#: budget: their spread says how far apart two plans must be to differ, profiles/plans.py
#: ``choose_model_plan``; a slow machine overruns the budget instead); the median counts.
ROUNDS = 3
#: Of a candidate's time once READY: the share spent on single images (each one image, one
#: caller, one after another); the rest on batches.
LATENCY_SHARE = 0.25
#: Single images timed per candidate: at least (the p50 of fewer is noise), at most.
SINGLES = (5, 60)
#: Each request's own deadline (a batch of 32 from 4 callers on a loaded 2-CPU machine takes
#: seconds; the round's time box, not this, bounds the measurement).
REQUEST_S = 120.0
#: A candidate's Triton may take this long to be READY even past its share of the budget: on a
#: loaded machine a start takes seconds more, and a plan that lost for that would be a plan
#: never measured (the budget is overrun instead, as by the rounds' last requests).
START_S = 60.0


def time_each(
    profiles: Iterable[Profile],
    timer: Callable[[Profile, float], list[float]],
    budget_s: Callable[[], float],
    what: str,
    budget_name: str = "measuring",
) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Each profile timed in turn within ``budget_s()`` seconds (asked before each): its
    figures, or why it could not be measured (whatever kept it from loading or answering: it
    loses). Shared by GPU calibration and ``auto`` on a CPU host (profiles/cpu_auto.py)."""
    throughput: dict[str, list[float]] = {}
    failures: dict[str, str] = {}
    for profile in profiles:
        budget = budget_s()
        try:
            if budget <= 0:
                raise TimeoutError(f"no {budget_name} budget left")
            throughput[profile] = timer(profile, budget)
        except Interrupted:
            raise
        except Exception as exc:
            text = str(exc).strip()
            failures[profile] = text.splitlines()[0] if text else type(exc).__name__
            log.warning("%s: the %s profile could not be measured: %s", what, profile,
                        failures[profile])  # fmt: skip
    return throughput, failures


def workload(batch_sizes: tuple[int, ...], callers: int) -> list[list[int]]:
    """Per caller, the batch sizes it sends in a round: every size, offset per caller so the
    batcher sees a mix at every moment."""
    sizes = list(batch_sizes)
    return [
        [sizes[(caller + i) % len(sizes)] for i in range(REQUESTS_PER_CALLER)]
        for caller in range(callers)
    ]


def batch_mix(
    host: Host,
    repository: RepositorySettings,
    export_dir: Path,
    *,
    budget_s: float,
    callers: int,
) -> list[float]:
    """Images per second per round with ``repository.profile`` served by a tritonserver of its
    own (started within ``budget_s``): batches of 1 and every preferred size, mixed
    (``workload``)."""
    deadline = time.monotonic() + budget_s
    sizes = tuple(sorted({1, *repository.preferred}))
    with host.trial(repository, export_dir, budget_s) as url:
        return asyncio.run(_mixed(url, sizes, callers, deadline, host.stop))


async def _mixed(
    url: str, sizes: tuple[int, ...], callers: int, deadline: float, stop: threading.Event
) -> list[float]:
    from clip_gateway.backend.protocol import ImageBatch
    from clip_gateway.backend.triton import TritonBackend

    backend = TritonBackend(url, TRITON_MODEL_NAME)
    try:
        info = await backend.model_info()
        rng = np.random.default_rng(0)
        shape = (info.image_size, info.image_size, 3)
        # plain batches, made once (this backend has no shared-memory regions to lend)
        pixels = {b: ImageBatch(rng.integers(0, 256, (b, *shape), dtype=np.uint8)) for b in sizes}

        async def caller(batches: list[int]) -> int:
            for batch in batches:
                await backend.embed_images(pixels[batch], deadline=deadline)
            return sum(batches)

        found: list[float] = []
        for _ in range(MIX_ROUNDS + 1):  # the first round warms up, not counted
            if stop.is_set():
                raise Interrupted("stop requested during calibration")
            started = time.perf_counter()
            sent = workload(sizes, callers)
            images = await asyncio.gather(*(caller(batches) for batches in sent))
            found.append(sum(images) / (time.perf_counter() - started))
        return found[1:]
    finally:
        await backend.close()


def time_plan(
    host: Host,
    repository: RepositorySettings,
    export_dir: Path,
    profile: str,
    plan: ModelPlan,
    budget_s: float,
) -> PlanTiming:
    """``plan`` of ``profile`` served by a tritonserver of its own (the image tower only: the
    plan is the same for both, the image tower is the heavier), READY within ``budget_s``; the
    rest of the budget split between single images and batch-32 rounds from ``CALLERS``
    callers, each batch split between the instances as the gateway splits a request
    (pipeline/service.py)."""
    deadline = time.monotonic() + budget_s
    planned = {"profile": profile, "instance_count": plan.instances, "cpu_threads": plan.threads}
    served = repository.model_copy(update=planned)
    timeout = max(START_S, deadline - time.monotonic())
    with host.trial(served, export_dir, timeout, image_only=True) as url:
        return asyncio.run(_timed(url, plan.instances, deadline, host.stop))


async def _timed(url: str, instances: int, deadline: float, stop: threading.Event) -> PlanTiming:
    from clip_gateway.backend.protocol import ImageBatch
    from clip_gateway.backend.triton import TritonBackend

    backend = TritonBackend(url, TRITON_MODEL_NAME)
    try:
        info = await backend.model_info()
        shape = (info.image_size, info.image_size, 3)
        pixels = np.random.default_rng(0).integers(0, 256, (BATCH, *shape), dtype=np.uint8)
        batch, single = ImageBatch(pixels), ImageBatch(pixels[:1].copy())
        chunk = -(-BATCH // max(1, instances))

        async def embed(images: ImageBatch) -> None:
            await backend.embed_images(images, deadline=time.monotonic() + REQUEST_S)

        async def request() -> int:  # one request of 32, shared between the instances
            parts = [batch.rows(i, min(BATCH, i + chunk)) for i in range(0, BATCH, chunk)]
            await asyncio.gather(*(embed(part) for part in parts))
            return BATCH

        async def caller(until: float) -> int:
            sent = await request()
            while time.monotonic() < until and not stop.is_set():
                sent += await request()
            return sent

        for _ in range(2):  # warm-up: both shapes, every instance
            await asyncio.gather(request(), embed(single))
        window = max(0.0, deadline - time.monotonic())
        latencies: list[float] = []
        singles_until = time.monotonic() + window * LATENCY_SHARE
        while len(latencies) < SINGLES[1] and (
            len(latencies) < SINGLES[0] or time.monotonic() < singles_until
        ):
            if stop.is_set():
                raise Interrupted("stop requested while timing the core plan")
            started = time.perf_counter()
            await embed(single)
            latencies.append(time.perf_counter() - started)
        # the first round warms up (not counted); then two rounds, and a third if it fits
        rates: list[float] = []
        took = 0.0
        while len(rates) <= ROUNDS:
            if stop.is_set():
                raise Interrupted("stop requested while timing the core plan")
            left = deadline - time.monotonic()
            if len(rates) >= 3 and left < took:
                break
            started = time.perf_counter()
            until = time.monotonic() + max(0.0, left) / (ROUNDS + 1 - len(rates))
            images = await asyncio.gather(*(caller(until) for _ in range(CALLERS)))
            took = time.perf_counter() - started
            rates.append(sum(images) / took)
        counted = rates[1:]
        median = statistics.median(counted)
        spread = (max(counted) - min(counted)) / median if median else 0.0
        return PlanTiming(median, 1000 * statistics.median(latencies), spread)
    finally:
        await backend.close()
