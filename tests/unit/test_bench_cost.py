"""The pure parts of ``python -m bench cost``: the process-tree CPU count, the profile's stages
and the smoke's verdict (a ratio to decode-only, never an absolute time)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

from bench import cost
from bench.harness import profiling


def test_cpu_seconds_counts_the_children_of_the_process() -> None:
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        while (theirs := cost.cpu_seconds(child.pid)) < 0.3:  # part of its loop is done
            time.sleep(0.01)
        own = time.process_time()  # this process alone, children excluded
        # 0.05 s: two counts rounded to clock ticks
        assert cost.cpu_seconds(os.getpid()) + 0.05 >= own + theirs
    finally:
        child.kill()
        child.wait()


def test_each_sample_goes_to_the_innermost_stage_it_names() -> None:
    root = "run (/x/threading.py:1)"
    decode = "_decode (/w/clip_gateway/imaging/jpeg.py:321)"
    walk = "walk (/w/clip_gateway/imaging/jpeg.py:118)"
    pre = "preprocess (/w/clip_gateway/imaging/preprocess.py:120)"
    assert profiling.stage([root, pre, walk, decode]) == "JPEG decode (libjpeg-turbo)"
    assert profiling.stage([root, pre, walk]) == "JPEG header walk"
    assert profiling.stage([root, pre]) == "preprocess: the rest (copy into the batch)"
    assert profiling.stage([root]) == "event loop + threads"
    assert profiling.stage(["main (/x/app.py:1)"]) == "other"


def _results(ratio: float | None, ok: int = 10) -> dict[str, Any]:
    row = {"dataset": "compact", "batch": 32, "ok": ok, "requests": 10,
           "images_per_cpu_s": 100.0, "decode_only_ratio": ratio}  # fmt: skip
    return {"phases": [row], "local": {"compact": {"decode_only": 1000.0}}}


def test_the_smoke_fails_only_on_a_large_regression_or_failed_requests() -> None:
    assert cost.smoke_verdict(_results(cost.SMOKE_FLOOR * 1.01)) is None
    assert "under" in (cost.smoke_verdict(_results(cost.SMOKE_FLOOR * 0.99)) or "")
    assert "9 of 10" in (cost.smoke_verdict(_results(0.5, ok=9)) or "")
