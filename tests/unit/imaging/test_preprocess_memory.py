"""Decoder memory, measured: for each format and mode, the peak the preprocessing of a generated
image adds to a fresh process is within 25 % of what the header-based estimate charges against
the decode budget (imaging/containers.py, imaging/preprocess.py). An estimate that is low lets
an image overshoot the budget (the issue: lossless WebP at ~13-16 bytes per pixel against the 8
assumed); one that is far too high refuses images that would fit.

Each case runs in its own process: the peak is VmHWM after the kernel's peak counter was reset
(/proc/self/clear_refs), minus the RSS before the decode, with glibc's mmap threshold at the
gateway's (config/memory.py), so freed buffers leave the RSS as they do in the gateway.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from clip_gateway.imaging import preprocess as images
from tests import samples

ROOT = Path(__file__).resolve().parents[3]
W, H = 3000, 2000  # 6 MP: large enough that the decoder's buffers dwarf its fixed overhead
CHILD = r"""
import sys
import numpy as np
from clip_gateway.imaging.preprocess import DecodeOptions, preprocess
from clip_gateway.config import memory

memory.tune()
data = open(sys.argv[1], "rb").read()
options = DecodeOptions(size=224, max_pixels=10**9, max_bytes=1 << 30, max_decode_bytes=1 << 40,
                       progressive_dc_only=False)
out = np.empty((224, 224, 3), np.uint8)
preprocess(data, out, options)  # the first call: imports, tables, pools

def status(key):
    line = next(l for l in open("/proc/self/status") if l.startswith(key))
    return int(line.split()[1]) * 1024

base = status("VmRSS")
open("/proc/self/clear_refs", "w").write("5")  # reset VmHWM to the current RSS
preprocess(data, out, options)
print(status("VmHWM") - base)
"""


def flat(mode: str) -> Image.Image:
    return Image.new(mode, (W, H), 120 if mode in ("L", "P") else (120, 130, 140, 200)[: len(mode)])


def noisy() -> Image.Image:
    pixels = np.random.default_rng(0).integers(0, 255, (H, W, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


CASES = {
    "png-rgb": lambda: samples.encode(flat("RGB"), "PNG"),
    "png-rgba": lambda: samples.encode(flat("RGBA"), "PNG"),
    "png-grey": lambda: samples.encode(flat("L"), "PNG"),
    "png-palette": lambda: samples.encode(flat("RGB").convert("P"), "PNG"),
    "webp-lossy": lambda: samples.encode(noisy(), "WEBP", quality=80, method=0),  # fast encoder
    "webp-lossless": lambda: samples.encode(flat("RGB"), "WEBP", lossless=True),
    "webp-lossless-alpha": lambda: samples.encode(flat("RGBA"), "WEBP", lossless=True),
    "gif": lambda: samples.encode(flat("RGB").convert("P"), "GIF"),
    "jpeg-progressive": lambda: samples.encode(noisy(), "JPEG", progressive=True),
}


def estimate(data: bytes) -> int:
    """What the budget check charges for ``data``: the smallest budget that admits it, to 64 KiB
    (found through the public path, not read back from the code). A budget too small is refused
    from the header alone, one that admits decodes the whole image: the search strides over the
    refusals, 4 MiB then 64 KiB at a time, so that only two budgets decode."""
    out = np.empty((224, 224, 3), np.uint8)
    step, limit = 1 << 16, (1 << 30) >> 16

    def admits(steps: int) -> bool:
        options = images.DecodeOptions(
            size=224, max_pixels=10**9, max_bytes=1 << 30, max_decode_bytes=steps * step
        )
        try:
            images.preprocess(data, out, options)
        except images.ImageTooLarge:
            return False
        return True

    refused = 0  # the largest budget known to be refused (in steps)
    for stride in (64, 1):
        while refused + stride <= limit and not admits(refused + stride):
            refused += stride
    return (refused + 1) * step


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="Linux /proc needed")
@pytest.mark.parametrize("case", sorted(CASES))
def test_measured_decoder_peak_is_within_a_quarter_of_the_estimate(
    case: str, tmp_path: Path
) -> None:
    data = CASES[case]()
    path = tmp_path / case
    path.write_bytes(data)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    measured = int(
        subprocess.run(
            [sys.executable, "-c", CHILD, str(path)],
            check=True, capture_output=True, text=True, env=env, timeout=120,
        ).stdout
    )  # fmt: skip
    charged = estimate(data)
    print(f"\n{case}: measured {measured / 2**20:.1f} MiB, estimated {charged / 2**20:.1f} MiB")
    assert abs(measured - charged) <= 0.25 * charged
