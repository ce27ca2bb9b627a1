"""``auto`` without a GPU: measure the CPU profiles that pass the quality gate through Triton on
this machine, serve the fastest, and keep the figures beside the export for the next start.

Model-alone figures do not predict the whole server (docs/PROFILES.md): ``cpu-bf16``'s graph beats
``cpu-int8``'s on a Xeon with AMX and loses to it through Triton. So each candidate is started in a
tritonserver of its own at its best core plan (its candidate plans each timed and the rule's
choice kept: profiles/planner.py) and sent batches of 32 from 4 callers, within one bounded
budget. The record holds for one machine signature (CPU model, flags, usable cores, runtime
versions, Triton backend, model identity, the gate's thresholds, how the plans are found): any
change measures again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import statistics
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from clip_gateway.config.machine import cpu_model as cpu_model  # what the record holds for
from clip_gateway.config.settings import Profile
from clip_gateway.profiles.timing import time_each

log = logging.getLogger(__name__)

RECORD = "cpu-choice.json"
#: Candidates in the order they are built, gated and measured: the quickest to build first
#: (``cpu-int8``'s files come with the export, ``cpu-bf16`` only checks), NNCF's minutes-long
#: build of ``cpu-int8-openvino`` last of those, so a tight start-up budget cuts that one; FP32
#: (``cpu``) last: it always passes the gate (it is the reference) and serves when nothing else
#: could be measured. Each measured one gets an equal share of the budget.
CANDIDATES: tuple[Profile, ...] = ("cpu-int8", "cpu-bf16", "cpu-int8-openvino", "cpu")
#: Python distributions in the Triton env whose versions decide the speed of a CPU profile (and
#: ``nncf``, the fidelity and speed of ``cpu-int8-openvino``'s files).
RUNTIMES = ("onnxruntime", "openvino", "nncf")

#: Measures one profile within ``budget_s`` seconds: images per second in each counted round.
Timer = Callable[[Profile, float], list[float]]


@dataclass(frozen=True)
class Choice:
    profile: Profile
    reason: str
    #: what the record is valid for (``signature``)
    signature: dict[str, Any]
    #: images per second in each counted round, per measured profile
    throughput: dict[str, list[float]] = field(default_factory=dict)
    #: why a candidate was not measured: its gate refused it, or it could not run here
    refused: dict[str, str] = field(default_factory=dict)
    #: why a measured candidate failed (did not load, ran out of budget)
    failures: dict[str, str] = field(default_factory=dict)
    #: seconds the measurement took
    seconds: float = 0.0

    def medians(self) -> dict[str, float]:
        return {p: round(statistics.median(r), 1) for p, r in self.throughput.items()}

    def section(self, source: str) -> dict[str, Any]:
        """What /v1/models shows (each tower's ``quantization.profile_choice``)."""
        return {
            "chosen": self.profile,
            "by": source,
            "images_per_s": self.medians(),
            "refused": self.refused,
            "failed": self.failures,
            "measured_s": round(self.seconds, 1),
            "machine": {k: self.signature[k] for k in ("cpu", "cpus", "runtimes")},
        }


def runtime_versions(python: Path | None) -> dict[str, str]:
    """The CPU runtimes' versions in the Triton env's interpreter (``absent`` where missing)."""
    if python is None:
        return {}
    script = (
        "import importlib.metadata as m\n"
        f"for name in {RUNTIMES!r}:\n"
        "    try: print(name, m.version(name))\n"
        "    except m.PackageNotFoundError: print(name, 'absent')\n"
    )
    try:
        done = subprocess.run([str(python), "-c", script], capture_output=True, text=True,
                              timeout=60, check=True)  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("runtime versions unreadable in %s (%s)", python, exc)
        return {}
    return dict(line.split(" ", 1) for line in done.stdout.strip().splitlines() if " " in line)


def signature(
    *,
    cpu: str,
    flags: frozenset[str],
    cpus: int,
    runtimes: Mapping[str, str],
    backend: str,
    model: str,
    gate: Mapping[str, float],
    plans: Mapping[str, tuple[int, int] | str] | None = None,
) -> dict[str, Any]:
    """What a measurement holds for; the flags as a digest (hundreds of them). ``plans``: the
    core plan (instances, threads) each candidate is timed with, or how it is found (its
    plans measured here: profiles/planner.py): another plan, another race."""
    digest = hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:16]
    found = {"cpu": cpu, "flags": digest, "cpus": cpus, "runtimes": dict(runtimes),
             "backend": backend, "model": model, "gate": dict(gate)}  # fmt: skip
    if plans is not None:
        found["plans"] = {profile: pair if isinstance(pair, str) else list(pair)
                          for profile, pair in plans.items()}  # fmt: skip
    return found


def recorded(record: Path, wanted: Mapping[str, Any]) -> Choice | None:
    """The recorded choice, if it was measured for exactly this signature."""
    try:
        data = json.loads(record.read_text())
        choice = Choice(**data)
    except (OSError, ValueError, TypeError):
        return None
    return choice if choice.signature == dict(wanted) else None


def fastest(throughput: Mapping[str, list[float]]) -> str:
    """The profile with the highest median images per second."""
    return max(throughput, key=lambda p: statistics.median(throughput[p]))


def measure(
    candidates: Mapping[Profile, str | None],
    timer: Timer,
    sig: Mapping[str, Any],
    *,
    budget_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> Choice:
    """Time every candidate the gate let through (``candidates``: profile → refusal or None),
    each in an equal share of ``budget_s`` (a share overrun by requests in flight is not taken
    from the next one's); the fastest measured one wins."""
    started = clock()
    refused: dict[str, str] = {p: why for p, why in candidates.items() if why is not None}
    runnable = [p for p, why in candidates.items() if why is None]
    if len(runnable) == 1:  # nothing to compare: no Triton started to time it
        (only,) = runnable
        lost = "; ".join(f"{p} refused: {w}" for p, w in refused.items())
        return Choice(only, f"the only CPU profile the gate lets through here ({lost})",
                      dict(sig), refused=refused)  # fmt: skip
    share = budget_s / max(1, len(runnable))
    throughput, failures = time_each(runnable, timer, lambda: share, "auto")
    seconds = clock() - started
    if not throughput:
        fallback: Profile = "cpu"
        why = "; ".join(f"{p}: {w}" for p, w in (refused | failures).items())
        return Choice(fallback, f"nothing measured ({why}); cpu, the FP32 reference", dict(sig),
                      throughput, refused, failures, seconds)  # fmt: skip
    winner: Profile = fastest(throughput)  # type: ignore[assignment]
    medians = {p: statistics.median(r) for p, r in throughput.items()}
    summary = ", ".join(f"{p} {m:.1f} img/s" for p, m in medians.items())
    lost = "".join(f"; {p} {'refused' if p in refused else 'failed'}: {w}"
                   for p, w in (refused | failures).items())  # fmt: skip
    reason = f"fastest gated CPU profile measured here: {summary}{lost}"
    return Choice(winner, reason, dict(sig), throughput, refused, failures, seconds)


def keep(choice: Choice, records: list[Path]) -> Path | None:
    """Write the choice to the first of ``records`` that can be written; where it went."""
    text = json.dumps(asdict(choice), indent=1)
    for record in records:
        try:
            record.parent.mkdir(parents=True, exist_ok=True)
            record.write_text(text)
            return record
        except OSError as exc:
            log.info("cannot keep the CPU profile choice at %s (%s)", record, exc)
    log.warning("the CPU profile choice could not be kept: the next start measures again")
    return None
