"""The quality gate: per tower, the cosine of a cheaper precision's embeddings (INT8 files, BF16
inference, OpenVINO's INT8) vs FP32's on the calibration set (calibration.py) must reach
documented thresholds, else it is refused with the numbers.

Torch-free and pure, and the one place the figures are computed and judged: the exporter records
the INT8 figures in the manifest and says whether they pass; the launcher holds every kind's
figures to the launch's own thresholds before it serves them, so an operator can tighten the gate
without exporting again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

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


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row by row, in float64."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    norms = np.linalg.norm(a64, axis=-1) * np.linalg.norm(b64, axis=-1)
    result: np.ndarray = (a64 * b64).sum(-1) / norms
    return result


def stats(cosines: np.ndarray) -> dict[str, float | int]:
    """What the gate reads of a tower's cosines (``vs_fp32``): their mean, minimum and count."""
    return {"mean": float(cosines.mean()), "min": float(cosines.min()), "count": len(cosines)}


def refusal(
    figures: dict[str, Any],
    thresholds: Thresholds,
    subject: str = "INT8",
    remedy: str = "export again with --int8",
) -> str | None:
    """Why ``subject`` must not be served (every failing tower, with its numbers), or None.

    ``figures``: per tower, ``vs_fp32`` with ``mean``, ``min`` and ``count`` (the manifest's
    ``int8.figures``, or what a launcher gate measured). A tower without figures fails: nothing
    was measured; no figures at all say how to measure them (``remedy``).
    """
    if not figures:
        return f"no {subject} figures were recorded: {remedy}"
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
    return f"{subject} refused by the quality gate: " + "; ".join(problems)
