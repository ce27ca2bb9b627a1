"""Calibration: measure both GPU profiles on this GPU once, keep the winner beside the engines.

What is measured is what the gateway sends: batches of every preferred size (the sizes Triton's
batcher forms and the gateway's chunks of big requests), from several callers at once (every
worker keeps requests in flight), in rounds. A profile wins only by more than ``MARGIN`` and
more than its rounds' own spread; a closer result keeps the table's choice. A profile that
cannot be measured (does not load, times out) loses, with its reason logged and recorded.
"""

from __future__ import annotations

import asyncio
import json
import logging
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from clip_gateway.config.processes import Interrupted
from clip_gateway.config.settings import Profile, Settings
from clip_gateway.launcher import engines
from clip_gateway.model.contract import TRITON_MODEL_NAME

log = logging.getLogger(__name__)

#: The faster profile must beat the other by this much (and by more than the spread of its own
#: rounds) before it replaces the table's choice: a few percent is noise on a shared host.
MARGIN = 0.10
ROUNDS = 3
#: Requests per caller per round.
REQUESTS_PER_CALLER = 8


class CalibrationFailed(RuntimeError):
    """Neither GPU profile could be measured; the message says why for each."""


@dataclass(frozen=True)
class Calibration:
    gpu: str
    #: The model's identity (clip_gateway.model.spec.model_identity), not a directory name.
    model: str
    winner: Profile
    reason: str
    #: images per second in each round, per measured profile
    throughput: dict[str, list[float]]
    #: why a profile could not be measured
    failures: dict[str, str] = field(default_factory=dict)


#: Measures one profile within ``budget_s`` seconds: images per second in each round.
Timer = Callable[[Profile, float], list[float]]


def decide(
    throughput: dict[str, list[float]], failures: dict[str, str], default: Profile
) -> tuple[Profile, str]:
    """The winner and why, from per-round throughputs (``default``: the table's choice)."""
    if not throughput:
        raise CalibrationFailed("; ".join(f"{p}: {why}" for p, why in failures.items()))
    if len(throughput) == 1:
        ((only, rounds),) = throughput.items()
        lost = ", ".join(f"{p} failed ({why})" for p, why in failures.items())
        return only, f"{lost}; {only} {statistics.median(rounds):.0f} img/s"  # type: ignore[return-value]
    medians = {p: statistics.median(r) for p, r in throughput.items()}
    spread = max((max(r) - min(r)) / statistics.median(r) for r in throughput.values())
    needed = max(MARGIN, spread)
    best, other = sorted(medians, key=medians.__getitem__, reverse=True)
    summary = ", ".join(f"{p} {m:.0f} img/s" for p, m in medians.items())
    if medians[best] > medians[other] * (1 + needed):
        return best, f"{summary}: {best} faster by more than {needed:.0%}"  # type: ignore[return-value]
    return default, f"{summary}: within {needed:.0%}, keeping {default}"


def time_each(
    profiles: Iterable[Profile],
    timer: Callable[[Profile, float], list[float]],
    budget_s: Callable[[], float],
    what: str,
    budget_name: str = "measuring",
) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Each profile timed in turn within ``budget_s()`` seconds (asked before each): its
    figures, or why it could not be measured (whatever kept it from loading or answering: it
    loses). Shared by GPU calibration and ``auto`` on a CPU host (launcher/cpu_auto.py)."""
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


def calibrate(
    gpu: str, model: str, timer: Timer, record: Path, *, default: Profile, deadline: float
) -> Calibration:
    """Measure both GPU profiles within the start-up deadline; record and return the result."""
    throughput, failures = time_each(
        ("cuda", "tensorrt"), timer, lambda: deadline - time.monotonic(), "calibration", "start-up"
    )
    winner, reason = decide(throughput, failures, default)
    result = Calibration(gpu, model, winner, reason, throughput, failures)
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(asdict(result), indent=1))
    return result


def recorded(record: Path, gpu: str, model: str) -> Calibration | None:
    """A previous calibration for this GPU and model identity, if any."""
    try:
        data = json.loads(record.read_text())
        result = Calibration(**data)
    except (OSError, ValueError, TypeError):
        return None
    if not engines.same_gpu(result.gpu, gpu) or result.model != model:
        return None
    return result


def workload(batch_sizes: tuple[int, ...], callers: int) -> list[list[int]]:
    """Per caller, the batch sizes it sends in a round: every size, offset per caller so the
    batcher sees a mix at every moment."""
    sizes = list(batch_sizes)
    return [
        [sizes[(caller + i) % len(sizes)] for i in range(REQUESTS_PER_CALLER)]
        for caller in range(callers)
    ]


def measure(
    profile: Profile,
    export_dir: Path,
    settings: Settings,
    stop: threading.Event,
    *,
    budget_s: float,
    callers: int,
) -> list[float]:
    """Images per second per round with ``profile`` loaded in a tritonserver of its own
    (started within ``budget_s`` and stopped here, in a private scratch directory).
    """
    from clip_gateway.backend.protocol import ImageBatch
    from clip_gateway.backend.triton import TritonBackend
    from clip_gateway.launcher.local import LocalTriton
    from clip_gateway.launcher.repository import render

    deadline = time.monotonic() + budget_s
    sizes = tuple(sorted({1, *settings.repository.preferred}))

    async def rounds(url: str) -> list[float]:
        backend = TritonBackend(url, TRITON_MODEL_NAME)
        try:
            info = await backend.model_info()
            rng = np.random.default_rng(0)
            shape = (info.image_size, info.image_size, 3)
            # plain batches, made once (this backend has no shared-memory regions to lend)
            pixels = {
                b: ImageBatch(rng.integers(0, 256, (b, *shape), dtype=np.uint8)) for b in sizes
            }

            async def caller(batches: list[int]) -> int:
                for batch in batches:
                    await backend.embed_images(pixels[batch], deadline=deadline)
                return sum(batches)

            found: list[float] = []
            for _ in range(ROUNDS + 1):  # the first round warms up, not counted
                if stop.is_set():
                    raise Interrupted("stop requested during calibration")
                started = time.perf_counter()
                sent = workload(sizes, callers)
                images = await asyncio.gather(*(caller(batches) for batches in sent))
                found.append(sum(images) / (time.perf_counter() - started))
            return found[1:]
        finally:
            await backend.close()

    with tempfile.TemporaryDirectory(prefix="clip-gateway-calibrate-") as scratch:
        repository = render(
            settings.repository.model_copy(update={"profile": profile}),
            export_dir,
            Path(scratch) / "model_repository",
        )
        log_file = settings.launch.log_file  # where serving's Triton logs go too
        triton = LocalTriton(repository, inherit_output=log_file is None, log_path=log_file,
                             stop_requested=stop)  # fmt: skip
        # the engines it builds are serving's (same cache directory): built under the same lock
        lock = engines.BuildLock(Path(settings.repository.trt_cache_path), stop)
        if profile == "tensorrt":
            lock.acquire(timeout=budget_s)
        built = False
        try:  # a start that fails or is interrupted leaves a process to stop too
            triton.start(timeout=deadline - time.monotonic())
            built = True
            return asyncio.run(rounds(triton.grpc_url))
        finally:
            triton.stop()
            triton.release_ports()
            lock.release(completed=built)
