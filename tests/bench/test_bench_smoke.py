"""The CI-sized runs of the live studies whose figures the docs quote and whose verdicts CI
keeps: `python -m bench cost --smoke` and `python -m bench host --smoke`. What is checked is that
each command still produces its whole report, and the verdicts it exits on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration  # the real stack (tests/bench/conftest.py)


def test_bench_cost_smoke(tmp_path: Path) -> None:
    """`python -m bench cost --smoke`: the gateway's CPU per image beside decode-only; it exits
    1 only on a large regression, read as a ratio to decode-only in the same run."""
    out = tmp_path / "cost"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "cost", "--smoke", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    results = json.loads((out / "cost.json").read_text())
    assert {(row["dataset"], row["batch"]) for row in results["phases"]} == {
        ("compact", 32),
        ("uploads", 32),
        ("camera", 4),
    }
    for row in results["phases"]:
        assert row["ok"] == row["requests"] > 0 and row["wrong"] == 0
        assert row["gateway_cpu_s"] > 0 and row["decode_only_ratio"] > 0
        assert all(rate > 0 for rate in row["decode_only_bracket"])  # timed around the phase
    assert results["local"]["compact"]["decode_only"] > 0
    assert results["imaging"]["resize"].startswith(("pillow ", "pillow-simd "))
    assert "| gateway / decode-only |" in (out / "cost.md").read_text()
    # the client's uploads now (the centre square, and the whole resize it is cut from): nearer
    # open_clip's own transform of the photo than the earlier one
    uploads = results["uploads"]
    earlier = uploads["upload (earlier: 8/7 size, 4:2:0)"]
    today = uploads["upload (today: the centre square)"]
    assert today["mean_abs_error"] < earlier["mean_abs_error"]
    assert uploads["upload (the whole 224-px resize)"]["mean_abs_error"] < earlier["mean_abs_error"]
    assert uploads["original, sent whole"]["mean_abs_error"] < today["mean_abs_error"]
    assert (out / "cost.png").stat().st_size > 10_000


def test_host_smoke(tmp_path: Path) -> None:
    """`python -m bench host --smoke`: the GPU host kit's command rehearsed on this CPU machine
    (docs/GPU_HOST.md), every phase producing figures, so it cannot rot between lent machines."""
    out = tmp_path / "host"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "host", "--smoke", "--provider", "cpu", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    results = json.loads((out / "host.json").read_text())
    rows = results["cpu_wall"]["rows"]
    assert [row["workers"] for row in rows[:2]] == [1, 2] and rows[-1]["name"].startswith(
        "core plan"
    )
    for row in rows:
        assert row["ok"] == row["requests"] > 0 and row["gateway_cpu_us_per_item"] > 0
        assert row["speedup_vs_1"] > 0 and row["efficiency"] > 0  # per-worker scaling reported
        # Triton's side of the hop beside the gateway's: the server and its Python-backend stubs
        assert row["triton_server_cpu_us_per_item"] > 0 and row["triton_stub_cpu_us_per_item"] > 0
        # decode-only of the same uploads on as many CPUs at once, the gateway gone: a JPEG's
        # floor, and what the machine alone adds per image as more CPUs are busy
        processes = row["decode_only_processes"]
        assert processes == min(row["workers"] * row["decode_threads"], os.cpu_count() or 1)
        assert 0 < row["decode_only_us_per_item"] < row["gateway_cpu_us_per_item"]
    one, two = rows[0], rows[1]
    # each worker's CPU over the cell: the clients' connections reach both workers
    busiest, other = two["worker_cpu_s"][:2]
    assert other >= 0.25 * busiest > 0, two["worker_cpu_s"]
    for key in ("gateway_cpu_us_per_item", "decode_only_us_per_item"):
        assert two["growth_vs_1"][key] == pytest.approx(two[key] / one[key] - 1, abs=1e-3)
    engine = results["engine:ViT-B-32"]
    assert engine["profile"] == "cpu" and engine["parity"]["image_cos_min"] > 0.9999
    assert engine["parity"]["text_cos_min"] > 0.9999
    assert {(r["batch"], r["concurrency"]) for r in engine["images"]} == {
        (1, 1),
        (1, 2),
        (8, 1),
        (8, 2),
    }
    assert all(r["ok"] == r["requests"] > 0 for r in engine["images"] + engine["texts"])
    for row in engine["images"] + engine["texts"]:
        assert row["triton_cpu_us_per_item"] > 0 and row["triton_rows_per_execution"] >= 1
        # model.py copies a batch at most once (requests merged by Triton), never twice
        assert 0 <= row["triton_copies_per_row"] <= 1 and row["triton_buffer_pinned"] is False
        # where Triton's part of each request's time went: the batcher's queue and the stages
        ms = row["triton_ms_per_request"]
        assert set(ms) == {"request", "queue", "input", "infer", "output"}, ms
        assert ms["infer"] > 0 and ms["request"] >= ms["queue"] + ms["infer"] - 0.05, ms
    for row in engine["images"]:
        # and the gateway's part (its Server-Timing): the Triton call holds Triton's own time
        gateway_ms = row["gateway_ms_per_request"]
        assert gateway_ms["decode"] > 0, gateway_ms
        assert gateway_ms["infer"] >= 0.9 * row["triton_ms_per_request"]["request"], row
    # each phase measured both sides first and split the cores by it (not pinned here: 2 CPUs)
    for phase in (results["cpu_wall"], engine):
        calibration = phase["calibration"]
        assert calibration["ok"] == calibration["requests"] > 0
        assert 0 < calibration["triton_share"] < 1 and calibration["pinned"] is False
    topology = results["environment"]["cpu_topology"]
    assert topology["physical_cores"] >= 1 and "smt_siblings" in topology
    ceilings = results["ceilings:ViT-B-32"]
    assert ceilings["provider"] == "CPUExecutionProvider" and set(ceilings["ort"]) == {"1", "8"}
    report = (out / "host.md").read_text()
    assert "## CPU wall" in report and "## ViT-B-32 through the gateway" in report
    assert "Per-image CPU against 1 worker's" in report and "gateway ÷ decode-only" in report
    assert "Triton ms/request: all (queue + in/infer/out)" in report
    assert report.count("Calibration (batch") == 2 and "Triton CPU µs/image" in report
    assert (out / "host.png").stat().st_size > 10_000
