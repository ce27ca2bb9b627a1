"""The cost study's smoke verdict (``python -m bench cost --smoke``, CI's regression check): a
ratio to decode-only, never an absolute time. A study's own checks live beside it."""

from __future__ import annotations

from typing import Any

from bench.studies import cost


def _results(ratio: float | None, ok: int = 10) -> dict[str, Any]:
    row = {"dataset": "compact", "batch": 32, "ok": ok, "requests": 10, "images_per_cpu_s": 100.0,
           "decode_only_ratio": ratio, "decode_only_bracket": [900.0, 1100.0]}  # fmt: skip
    return {"phases": [row], "local": {"compact": {"decode_only": 1000.0}}}


def test_the_smoke_fails_only_on_a_large_regression_or_failed_requests() -> None:
    assert cost.smoke_verdict(_results(cost.SMOKE_FLOOR * 1.01)) is None
    assert "under" in (cost.smoke_verdict(_results(cost.SMOKE_FLOOR * 0.99)) or "")
    assert "9 of 10" in (cost.smoke_verdict(_results(0.5, ok=9)) or "")


def test_each_phase_is_compared_with_decode_only_timed_around_it() -> None:
    row = {"images_per_cpu_s": 500.0, "decode_only_bracket": [900.0, 1100.0]}
    assert cost.decode_only_rate(row) == 1000.0
    assert cost._ratio(row) == 0.5
    assert cost._ratio(row | {"images_per_cpu_s": None}) is None
