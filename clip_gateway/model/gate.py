"""The INT8 quality gate: per tower, the cosine of INT8 vs FP32 embeddings on the calibration set
(calibration.py) must reach documented thresholds, else INT8 is refused with the numbers.

Torch-free and pure: the exporter records the figures in the manifest and says whether they
pass; the launcher (``cpu-int8`` profile) checks the same figures against its own thresholds
before it serves an INT8 file, so an operator can tighten the gate without exporting again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Mean cosine, INT8 vs FP32, each tower must reach on the calibration set. Measured on random
#: weights (seed 0): 0.9998+ for both towers (docs/PROFILES.md "The cpu-int8 profile").
MIN_MEAN_COSINE = 0.998
#: The worst single item's cosine. At least the readiness canary's own threshold
#: (GATEWAY_CANARY_MIN_COSINE, 0.99): an item the gate lets through must not be one the canary
#: would call a broken model.
MIN_COSINE = 0.99


@dataclass(frozen=True)
class Thresholds:
    mean: float = MIN_MEAN_COSINE
    min: float = MIN_COSINE

    def as_dict(self) -> dict[str, float]:
        return {"min_mean_cosine": self.mean, "min_cosine": self.min}


def refusal(figures: dict[str, Any], thresholds: Thresholds) -> str | None:
    """Why INT8 must not be served (every failing tower, with its numbers), or None.

    ``figures`` is the manifest's ``int8.figures``: per tower, ``vs_fp32`` with ``mean``,
    ``min`` and ``count``. A tower without figures fails: nothing was measured.
    """
    if not figures:
        return "no INT8 figures were recorded: export again with --int8"
    problems = []
    for tower, measured in sorted(figures.items()):
        cosine = measured.get("vs_fp32") or {}
        mean, low = cosine.get("mean"), cosine.get("min")
        if mean is None or low is None:
            problems.append(f"{tower} tower: no cosine figures")
            continue
        failed = []
        if mean < thresholds.mean:
            failed.append(f"mean {mean:.5f} < {thresholds.mean}")
        if low < thresholds.min:
            failed.append(f"min {low:.5f} < {thresholds.min}")
        if failed:
            items = cosine.get("count", "?")
            problems.append(f"{tower} tower cosine vs FP32 {', '.join(failed)} ({items} items)")
    if not problems:
        return None
    return "INT8 refused by the quality gate: " + "; ".join(problems)
