"""``python -m bench.decode_factors``: the CPU seconds one decode + resize to 224 px costs per
source pixel and per encoded byte, per format and coding, on flat and noisy images (best of 3, one
thread): the figures behind imaging/work.py's FACTORS (docs/ADMISSION.md). Arithmetic-coded JPEGs
are made with libjpeg-turbo's ``jpegtran -arithmetic`` when it is installed."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from bench.photos import photo
from clip_gateway.imaging.preprocess import ImageOptions, preprocess
from tests import samples

OPTIONS = ImageOptions(
    size=224, max_pixels=100_000_000, max_bytes=64 << 20, max_decode_bytes=4 << 30
)
CODINGS: dict[str, tuple[str, dict[str, object]]] = {
    "jpeg-baseline": ("JPEG", {}),
    "jpeg-progressive": ("JPEG", {"progressive": True}),
    "png": ("PNG", {}),
    "webp-lossy": ("WEBP", {"quality": 80}),
    "webp-lossless": ("WEBP", {"lossless": True}),
    "gif": ("GIF", {}),
}


def cpu_s(data: bytes, reps: int = 3) -> float:
    out = np.empty((224, 224, 3), np.uint8)
    best = float("inf")
    for _ in range(reps):
        start = time.process_time()
        preprocess(data, out, OPTIONS)
        best = min(best, time.process_time() - start)
    return best


def arithmetic(jpeg: bytes) -> bytes | None:
    tool = shutil.which("jpegtran")
    if tool is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        source, target = Path(tmp) / "in.jpg", Path(tmp) / "out.jpg"
        source.write_bytes(jpeg)
        subprocess.run([tool, "-arithmetic", "-outfile", str(target), str(source)], check=True)
        return target.read_bytes()


def main() -> None:
    for width, height in ((2000, 1500), (4000, 3000)):
        images = {
            "photo": photo(width, height, seed=1).convert("RGB"),
            "flat": Image.new("RGB", (width, height), (120, 130, 140)),
        }
        for label, image in images.items():
            for coding, (fmt, options) in CODINGS.items():
                source = image.convert("P") if fmt == "GIF" else image
                data = samples.encode(source, fmt, **options)
                seconds = cpu_s(data)
                per_pixel = seconds / (width * height) * 1e9
                per_byte = seconds / len(data) * 1e9
                print(
                    f"{label} {width}x{height} {coding}: {len(data)} B, {seconds * 1e3:.1f} ms, "
                    f"{per_pixel:.2f} ns/px, {per_byte:.1f} ns/B",
                    flush=True,
                )
            coded = arithmetic(samples.encode(image, "JPEG"))
            if coded is not None:
                seconds = cpu_s(coded)
                name = f"{label} {width}x{height} jpeg-arithmetic"
                print(f"{name}: {len(coded)} B, {seconds * 1e3:.1f} ms", flush=True)


if __name__ == "__main__":
    main()
