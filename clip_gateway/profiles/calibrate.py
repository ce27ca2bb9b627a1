"""Calibration: measure both GPU profiles on this GPU once, keep the winner beside the engines.

What is measured is what the gateway sends (profiles/timing.py ``batch_mix``): batches of every
preferred size (the sizes Triton's batcher forms and the gateway's chunks of big requests), from
several callers at once (every worker keeps requests in flight), in rounds. A profile wins only
by more than ``MARGIN`` and more than its rounds' own spread; a closer result keeps the table's
choice. A profile that cannot be measured (does not load, times out) loses, with its reason
logged and recorded.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from clip_gateway.config.settings import Profile
from clip_gateway.profiles import engines
from clip_gateway.profiles.timing import time_each

log = logging.getLogger(__name__)

#: The faster profile must beat the other by this much (and by more than the spread of its own
#: rounds) before it replaces the table's choice: a few percent is noise on a shared host.
MARGIN = 0.10


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
