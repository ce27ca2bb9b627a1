"""The peer bench's pieces (bench/peers.py, peers_report.py, ceilings.py, peer_checkpoint.py),
without Infinity: its wire format both ways, the goals computed from a run's figures, the
ceilings' arithmetic, and the tokenizer files the peer's checkpoint is given."""

from __future__ import annotations

import base64
import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from bench import peers, peers_report
from bench.harness import ceilings, peer_checkpoint
from tests import samples


def test_infinity_gets_data_uris_and_answers_base64_floats() -> None:
    images = [samples.compact(0), samples.compact(1)]
    body = orjson.loads(peers.request_body(images, "clip"))
    assert body["model"] == "clip" and body["encoding_format"] == "base64"
    for uri, data in zip(body["input"], images, strict=True):
        head, payload = uri.split(",", 1)
        assert head == "data:image/jpeg;base64" and base64.b64decode(payload) == data
    rows = np.arange(6, dtype="<f4").reshape(2, 3)
    answer = {"data": [{"embedding": base64.b64encode(r.tobytes()).decode()} for r in rows]}
    np.testing.assert_array_equal(peers.vectors(orjson.dumps(answer)), rows)


def test_every_cell_is_measured_in_order() -> None:
    names = [peers.cell_name(b, c) for b, c in peers.CELLS]
    assert names == ["b1xc1", "b1xc4", "b8xc1", "b8xc4", "b32xc1", "b32xc4"]


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
    bf16 = {"before": {"load_1m": 0.2}, "cells": {"b32xc4": cell(110, 900.0)}}
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


def test_vit_b32_operations_per_image() -> None:
    # 4.41 G multiply-adds: the figure ViT-B/32's papers give (4.4 GFLOPs as MACs)
    assert pytest.approx(8.82, abs=0.01) == ceilings.VIT_B32_GOP


def test_the_gemm_ceilings_measure_both_precisions() -> None:
    found = ceilings.gemm_ceilings(n=128, threads=1, reps=1)
    assert found["fp32_gflops"] > 0 and found["int8_gops"] > 0
    assert (found["n"], found["threads"]) == (128, 1)


@pytest.mark.torch
def test_the_peer_tokenizer_is_open_clips_vocabulary(tmp_path: Path) -> None:
    import open_clip
    from open_clip.tokenizer import SimpleTokenizer

    bpe = Path(open_clip.__file__).parent / "bpe_simple_vocab_16e6.txt.gz"
    vocab_file, merges_file = peer_checkpoint.write_tokenizer_files(bpe, tmp_path)
    vocab = json.loads(vocab_file.read_text())
    ours = SimpleTokenizer().encoder
    # open_clip names its specials <start_of_text>/<end_of_text>; Hugging Face's CLIP tokenizer
    # expects OpenAI's <|startoftext|>/<|endoftext|>: the same ids
    assert vocab.pop("<|startoftext|>") == ours.pop("<start_of_text>") == 49406
    assert vocab.pop("<|endoftext|>") == ours.pop("<end_of_text>") == 49407
    assert vocab == ours  # token for token, id for id
    merges = merges_file.read_text().splitlines()
    with gzip.open(bpe) as packed:
        assert merges[1] == packed.read().decode().split("\n")[1]
    assert len(peer_checkpoint.bytes_to_unicode()) == 256
