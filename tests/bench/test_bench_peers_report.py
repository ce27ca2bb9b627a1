"""The peers study's report (peers_report.py): the goals computed from a run's figures, and the
Markdown, JSON and plot written from them. A study's own checks live beside it; tests/ imports
only bench.harness."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.studies import peers_report


def cell(img_s: float, p50: float) -> dict[str, Any]:
    return {"images_per_s": img_s, "latency_ms": {"p50": p50, "p95": p50 * 2}}


def run_results(int8_b32: float, int8_p50: float, alone: float) -> dict[str, Any]:
    cells = ("b1xc1", "b32xc4")
    measured = {
        "infinity": {"b1xc1": cell(10, 100.0), "b32xc4": cell(20, 6000.0)},
        "gateway-cpu": {"b1xc1": cell(12, 80.0), "b32xc4": cell(21, 5500.0)},
        "gateway-cpu-int8": {"b1xc1": cell(50, int8_p50), "b32xc4": cell(int8_b32, 1500.0)},
    }
    return {
        "machine": {"cpu_model": "Test CPU", "nproc": 2, "load_avg": [0.1, 0.2, 0.3]},
        "command": "python -m bench peers",
        "limits": {"requests": 400, "seconds": 30.0, "warmup": 2},
        "ceilings_before": {"load_1m": 0.1},
        "ceilings": {"fp32_gflops": 200.0, "int8_gops": 1000.0, "n": 4096, "threads": 2},
        "model_alone": {
            "fp32": {"batch32_img_s": 20.0, "batch1_ms": 60.0},
            "int8": {"batch32_img_s": alone, "batch1_ms": 15.0},
        },
        "gop_per_image": 10.0,
        "systems": {
            name: {
                "before": {"load_1m": 0.2},
                "cells": {k: c for k, c in found.items() if k in cells},
            }
            for name, found in measured.items()
        },
    }


def test_the_goals_are_ratios_of_the_same_run() -> None:
    goals = {g: (measured, met) for g, _, measured, met in
             peers_report.goals(run_results(int8_b32=40.0, int8_p50=50.0, alone=60.0))}  # fmt: skip
    int8 = goals["gateway cpu-int8: batch 32 x 4 img/s vs Infinity's"]
    assert int8 == ("2.00× (40.0 vs 20.0)", True)
    assert goals["gateway cpu (FP32): batch 32 x 4 img/s vs Infinity's"] == (
        "1.05× (21.0 vs 20.0)", True)  # fmt: skip
    assert goals["gateway cpu-int8: single-image p50 vs Infinity's"] == (
        "0.50× (50.0 vs 100.0 ms)", True)  # fmt: skip
    # 60 img/s x 10 GOP = 600 of 1000 GOP/s
    share, met = goals["INT8 model alone (ORT, batch 32) vs the INT8 GEMM ceiling"]
    assert share.startswith("0.60×") and met


def test_missed_goals_are_reported_as_missed(tmp_path: Path) -> None:
    results = run_results(int8_b32=30.0, int8_p50=70.0, alone=20.0)
    assert [met for *_, met in peers_report.goals(results)] == [False, True, False, False]
    peers_report.write(results, tmp_path)
    text = (tmp_path / "peers.md").read_text()
    assert "| 1.50× (30.0 vs 20.0) | no |" in text.replace("| ≥ 1.8× ", "")
    assert "Infinity (torch CPU)" in text and "p50 100 / p95 200 ms" in text
    assert json.loads((tmp_path / "peers.json").read_text()) == results
    assert (tmp_path / "peers.png").read_bytes().startswith(b"\x89PNG")


def test_the_five_times_goal_takes_the_better_of_int8_and_bf16() -> None:
    results = run_results(int8_b32=40.0, int8_p50=50.0, alone=60.0)
    goal = "batch 32 x 4 img/s vs Infinity's"
    assert not [g for g, *_ in peers_report.goals(results) if g.startswith("best CPU profile")]
    bf16: dict[str, Any] = {"before": {"load_1m": 0.2}, "cells": {"b32xc4": cell(110, 900.0)}}
    results["systems"]["gateway-cpu-bf16"] = bf16
    rows = {g: (measured, met) for g, _, measured, met in peers_report.goals(results)}
    assert rows[f"best CPU profile (gateway cpu-bf16 (OpenVINO)): {goal}"] == (
        "5.50× (110.0 vs 20.0)", True)  # fmt: skip
    bf16["cells"]["b32xc4"] = cell(30, 900.0)  # INT8's 40 is now the better: 2x, missed
    rows = {g: (measured, met) for g, _, measured, met in peers_report.goals(results)}
    assert rows[f"best CPU profile (gateway cpu-int8): {goal}"] == ("2.00× (40.0 vs 20.0)", False)


def test_the_default_is_held_to_the_best_profile_and_to_infinity(tmp_path: Path) -> None:
    results = run_results(int8_b32=40.0, int8_p50=50.0, alone=60.0)
    results["systems"]["gateway-auto"] = {
        "before": {"load_1m": 0.2},
        "cells": {"b1xc1": cell(50, 30.0), "b32xc4": cell(39.0, 1500.0)},
        "profile_choice": {"chosen": "cpu-int8", "by": "measured", "measured_s": 60.0,
                           "images_per_s": {"cpu-int8": 41.0, "cpu": 20.0}, "refused": {}},
    }  # fmt: skip
    rows = {g: (measured, met) for g, _, measured, met in peers_report.goals(results)}
    default = "gateway default (auto → cpu-int8)"
    assert rows[f"{default}: batch 32 x 4 img/s vs the best profile's (gateway cpu-int8)"] == (
        "0.97× (39.0 vs 40.0)", True)  # fmt: skip
    assert rows[f"{default}: batch 32 x 4 img/s vs Infinity's"] == ("1.95× (39.0 vs 20.0)", False)
    assert rows[f"{default}: single-image p50 vs Infinity's"] == ("0.30× (30.0 vs 100.0 ms)", True)
    results["systems"]["gateway-auto"]["cells"]["b32xc4"] = cell(37.0, 1500.0)  # 0.925x: missed
    rows = {g: (measured, met) for g, _, measured, met in peers_report.goals(results)}
    assert not rows[f"{default}: batch 32 x 4 img/s vs the best profile's (gateway cpu-int8)"][1]
    peers_report.write(results, tmp_path)
    assert "chose cpu-int8 (measured)" in (tmp_path / "peers.md").read_text()


def test_the_default_is_held_to_the_best_fixed_plan_of_its_profile(tmp_path: Path) -> None:
    """Issue 41: the default's measured plan keeps >= 0.95x the batch throughput of the best
    fixed plan of the profile it chose, and its single image <= 0.35x Infinity's."""
    results = run_results(int8_b32=40.0, int8_p50=50.0, alone=60.0)
    fixed = {"gateway-cpu-int8@2x1": (42.0, 60.0), "gateway-cpu-int8@1x2": (40.5, 30.0)}
    for name, (rate, p50) in fixed.items():
        cells = {"b1xc1": cell(30, p50), "b32xc4": cell(rate, 2000)}
        results["systems"][name] = {"before": {"load_1m": 0.2}, "cells": cells}
    results["systems"]["gateway-auto"] = {
        "before": {"load_1m": 0.2}, "cells": {"b1xc1": cell(32, 31.0), "b32xc4": cell(40.3, 2100)},
        "profile_choice": {"chosen": "cpu-int8", "by": "measured now", "images_per_s": {}},
        "core_plan": {"instances": 1, "threads": 2, "by": "measured now", "rule": "the rule",
                      "measured": {"1x2": {"images_per_s": 40.1, "single_p50_ms": 29.0}}},
    }  # fmt: skip
    rows = {g: (measured, met) for g, _, measured, met in peers_report.goals(results)}
    name = "gateway default (auto → cpu-int8, 1x2)"
    best = "gateway cpu-int8, fixed plan 2x1 (instances x threads)"
    assert rows[f"{name}: batch 32 x 4 img/s vs the best fixed plan's ({best})"] == (
        "0.96× (40.3 vs 42.0)", True)  # fmt: skip
    assert rows[f"{name}: single-image p50 vs Infinity's"] == ("0.31× (31.0 vs 100.0 ms)", True)
    peers_report.write(results, tmp_path)
    text = (tmp_path / "peers.md").read_text()
    assert "The default's core plan: 1 instance(s) x 2 thread(s) per tower (measured now" in text
