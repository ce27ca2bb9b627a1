"""``python -m bench pillow-compare``: ``preprocess()`` per CPU-second with this venv's PIL and with
stock Pillow (put first on ``PYTHONPATH``, bench/harness/pillow.py), on the same compact JPEGs.

What a fresh machine would run without pillow-simd, beside what ``make install`` builds
(docs/PERFORMANCE.md). Each in a process of its own; the best of three passes of one thread's
CPU time, so other work on the machine does not count.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def measure() -> dict[str, object]:
    import numpy as np

    from bench.harness.cpu import per_cpu_second
    from bench.harness.photos import compact_jpeg
    from clip_gateway.imaging import paths
    from clip_gateway.imaging.preprocess import DecodeOptions, preprocess

    pool = [compact_jpeg(1000 + i) for i in range(64)]
    out = np.empty((224, 224, 3), np.uint8)
    options = DecodeOptions(size=224, max_pixels=10**8, max_bytes=1 << 30)
    rate = max(per_cpu_second(lambda d: preprocess(d, out, options), pool, 4) for _ in range(3))
    return {"resize": paths.current().resize, "preprocess_img_per_cpu_s": round(rate, 1)}


def child(argv: list[str]) -> int:
    """``python -m bench.harness.child pillow_compare``: this interpreter's PIL, measured."""
    print(json.dumps(measure()))
    return 0


def main(argv: list[str]) -> int:
    del argv  # no options
    from bench.harness.pillow import stock_pillow
    from clip_gateway.model.spec import default_cache_dir

    stock = stock_pillow(default_cache_dir())
    rows = []
    for extra in [[], [str(stock)]] if stock else [[]]:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([*extra, str(ROOT)]))
        done = subprocess.run(
            [sys.executable, "-m", "bench.harness.child", "pillow_compare"],
            env=env, cwd=ROOT, capture_output=True, text=True, check=True,
        )  # fmt: skip
        rows.append(json.loads(done.stdout))
        print(done.stdout.strip())
    if len(rows) == 2:
        ours, stock_rate = (float(str(row["preprocess_img_per_cpu_s"])) for row in rows)
        print(f"{rows[0]['resize']} / {rows[1]['resize']}: {ours / stock_rate:.2f}x")
    return 0
