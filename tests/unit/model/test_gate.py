"""The quality gate (clip_gateway/model/gate.py): the one cosine and its figures, which figures
pass, and what a refusal says, for every kind it judges."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from clip_gateway.config.settings import LaunchSettings, ServerSettings
from clip_gateway.model.gate import (
    MIN_COSINE,
    MIN_MEAN_COSINE,
    Thresholds,
    cosine,
    refusal,
    stats,
)


def figures(image: tuple[float, float], text: tuple[float, float] | None = None) -> dict[str, Any]:
    towers = {"image": {"vs_fp32": {"mean": image[0], "min": image[1], "count": 48}}}
    if text is not None:
        towers["text"] = {"vs_fp32": {"mean": text[0], "min": text[1], "count": 96}}
    return towers


def test_figures_above_both_thresholds_pass() -> None:
    assert refusal(figures((0.9998, 0.9997), (0.9993, 0.999)), Thresholds()) is None


def test_thresholds_are_inclusive() -> None:
    assert refusal(figures((0.998, 0.99)), Thresholds(0.998, 0.99)) is None


@pytest.mark.parametrize(
    ("measured", "expected"),
    [
        (figures((0.997, 0.995)), ["image tower", "mean 0.99700 < 0.998", "(48 items)"]),
        (figures((0.999, 0.985)), ["image tower", "min 0.98500 < 0.99"]),
        (figures((0.9999, 0.9998), (0.99, 0.95)), ["text tower", "mean 0.99000", "min 0.95000"]),
    ],
)
def test_a_tower_below_a_threshold_is_refused_with_its_numbers(
    measured: dict[str, Any], expected: list[str]
) -> None:
    reason = refusal(measured, Thresholds())
    assert reason is not None and reason.startswith("INT8 refused by the quality gate")
    for part in expected:
        assert part in reason


def test_every_failing_tower_is_named() -> None:
    reason = refusal(figures((0.5, 0.4), (0.6, 0.5)), Thresholds())
    assert reason is not None and "image tower" in reason and "text tower" in reason


def test_a_tighter_launch_threshold_refuses_what_the_export_accepted() -> None:
    measured = figures((0.9998, 0.9997))
    assert refusal(measured, Thresholds()) is None
    assert refusal(measured, Thresholds(mean=0.99999)) is not None


@pytest.mark.parametrize(
    ("measured", "expected"),
    [({}, "export again with --int8"), ({"image": {}}, "image tower: no cosine figures")],
)
def test_nothing_measured_is_refused(measured: dict[str, Any], expected: str) -> None:
    reason = refusal(measured, Thresholds())
    assert reason is not None and expected in reason


def test_the_launch_settings_default_to_the_documented_gate(monkeypatch) -> None:
    for name in ("GATEWAY_INT8_MIN_MEAN_COSINE", "GATEWAY_INT8_MIN_COSINE"):
        monkeypatch.delenv(name, raising=False)
    launch = LaunchSettings()
    assert (launch.int8_min_mean_cosine, launch.int8_min_cosine) == (MIN_MEAN_COSINE, MIN_COSINE)
    # an item the gate lets through is never one the readiness canary would call broken
    assert ServerSettings.model_fields["canary_min_cosine"].default <= MIN_COSINE


def test_the_cosine_is_row_by_row_in_float64_whatever_the_scale() -> None:
    a = np.array([[1.0, 0.0], [3.0, 4.0], [1.0, 1.0]], dtype=np.float16)
    b = np.array([[0.0, 2.0], [6.0, 8.0], [-1.0, -1.0]], dtype=np.float32)
    found = cosine(a, b)
    assert found.dtype == np.float64
    assert found.tolist() == pytest.approx([0.0, 1.0, -1.0])
    assert stats(found) == {"mean": pytest.approx(0.0), "min": pytest.approx(-1.0), "count": 3}


def test_every_kind_is_refused_in_the_same_words_with_its_own_name_and_remedy() -> None:
    """INT8 files, BF16 inference and OpenVINO's INT8 are held to one gate: one text, the kind
    named where INT8's is (its exporter records this text in the manifest)."""
    low = figures((0.997, 0.995))
    int8 = refusal(low, Thresholds())
    assert int8 is not None
    for kind in ("BF16", "OpenVINO INT8"):
        assert refusal(low, Thresholds(), kind, "measure again") == int8.replace("INT8", kind, 1)
        assert refusal({}, Thresholds(), kind, "measure again") == (
            f"no {kind} figures were recorded: measure again"
        )
    assert refusal(figures((0.9998, 0.9997)), Thresholds(), "BF16", "measure again") is None
