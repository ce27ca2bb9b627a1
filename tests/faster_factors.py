"""``python -m tests.faster_factors``: the gateway's HTTP process (``python -m clip_gateway.http``)
whose committed decode factors (imaging/work.py) are ``GATEWAY_TEST_FACTORS_DIVISOR`` times too
low, as if measured on a CPU that many times faster than this one: what a slower machine than
the one they were measured on sees of them (issue 42: a 2-core Xeon decoded a progressive strip
2.5x slower than they price it). Nothing else is changed."""

from __future__ import annotations

import os
import runpy

from clip_gateway.imaging import work

DIVISOR = float(os.environ.get("GATEWAY_TEST_FACTORS_DIVISOR", "4"))

for coding, (per_unit, per_byte) in list(work.FACTORS.items()):
    work.FACTORS[coding] = (per_unit / DIVISOR, per_byte / DIVISOR)
work.JPEG_OUTPUT_S_PER_PIXEL /= DIVISOR
work.RESIZE_S_PER_PIXEL /= DIVISOR

if __name__ == "__main__":
    runpy.run_module("clip_gateway.http", run_name="__main__", alter_sys=True)
