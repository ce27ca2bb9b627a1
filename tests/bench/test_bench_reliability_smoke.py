"""CI-sized versions of the overload and soak runs (the long ones are bench commands)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration  # the real stack (tests/bench/conftest.py)


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.parametrize("photos", ["compact", "camera"])
def test_overload_smoke(tmp_path: Path, photos: str) -> None:
    done = bench("overload", "--smoke", "--photos", photos, "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout[-1500:] + done.stderr[-1500:]
    results = json.loads((tmp_path / "overload.json").read_text())
    assert results["wrong"] == 0  # every answer was the right image's embedding
    assert results["unexpected_5xx"] == 0
    at_1x, at_2x = results["at_1x"], results["at_2x"]
    assert at_1x["ok"] > 0 and at_2x["ok"] > 0
    assert set(at_2x["statuses"]) <= {"200", "429", "503"}
    # twice the measured capacity for 6 s overfills the 2 s admission horizon (4 s deadline in
    # the smoke run): the gateway itself must refuse the excess (429), and no accepted request
    # may run out its deadline (no 504: unexpected_5xx above)
    assert at_2x["statuses"].get("429", 0) > 0
    assert results["rejected_by_reason"].get("overloaded", 0) >= at_2x["statuses"]["429"]
    assert (tmp_path / "overload.md").exists() and (tmp_path / "overload.png").exists()
    assert results["photos"] == photos


def test_soak_smoke(tmp_path: Path) -> None:
    done = bench("soak", "--smoke", "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout[-1500:] + done.stderr[-1500:]
    results = json.loads((tmp_path / "soak.json").read_text())
    assert results["load"]["ok"] == results["load"]["requests"] > 0
    assert results["load"]["wrong"] == 0
    # no Python thread may appear once warm (a pool growing per request was a real bug: a sync
    # guard sent every request through the loop's default executor); gRPC's own event-engine pool
    # may add a worker under load, so the total is allowed a little slack
    assert "python" not in results["threads_grown"], results["threads_grown"]
    assert results["thread_growth"] <= 2, results["threads_grown"]
    assert results["rss_growth_mb"] < 50
    assert len(results["samples"]) >= 5


def test_tracing_cost_smoke(tmp_path: Path) -> None:
    done = bench("tracing", "--smoke", "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout[-1500:] + done.stderr[-1500:]
    results = json.loads((tmp_path / "tracing.json").read_text())
    assert set(results["modes"]) == {"off", "on, 0% sampled", "on, 100% sampled"}
    for row in results["modes"].values():
        assert row["single"]["ok"] > 0 and row["batch_8"]["ok"] > 0
    assert results["span_bytes_received"] > 0  # the sampled run really exported spans


def test_footprint_smoke(tmp_path: Path) -> None:
    """The launch path's processes are measured, and torch is mapped in none of them."""
    done = bench("footprint", "--smoke", "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout[-1500:] + done.stderr[-1500:]
    results = json.loads((tmp_path / "footprint.json").read_text())
    roles = {p["role"] for p in results["processes"]}
    assert {"supervisor", "tritonserver", "gateway (serving process)"} <= roles
    assert not results["torch_loaded_anywhere"]
    assert results["serving_rss_mb"] > 0


def test_texts_smoke(tmp_path: Path) -> None:
    """Texts, mixed requests and images through the real stack: every answer right, a row per
    shape and concurrency, the table written."""
    done = bench("texts", "--smoke", "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout[-1500:] + done.stderr[-1500:]
    results = json.loads((tmp_path / "texts.json").read_text())
    assert results["wrong"] == 0 and results["unexpected_5xx"] == 0
    cells = {(c["cell"], c["concurrency"]): c for c in results["cells"]}
    assert set(cells) == {(name, n) for name in ("text x1", "text x32", "mixed 16+16", "image x32")
                          for n in (1, 4)}  # fmt: skip
    for cell in cells.values():
        # 429: admission refused work beyond its horizon (a loaded 2-core machine); nothing else
        assert cell["ok"] > 0 and set(cell["statuses"]) <= {"200", "429"}, cell
    assert cells[("text x32", 1)]["server_ms_mean"]["tokenize"] > 0  # Server-Timing was read
    assert "| text x32 | 4 |" in (tmp_path / "texts.md").read_text()
