"""Decode+preprocess throughput per core: naive PIL + open_clip transforms vs the gateway's path.

Single-threaded and pinned to one core, so "img/s" is per core. Both pipelines start from the
same JPEG bytes and end with what the model consumes (a float tensor for open_clip's transform,
uint8 [224, 224, 3] for ours, which the graph normalises).
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from bench.harness.photos import CAMERA_SIZES, compact_jpeg, jpeg, photo
from clip_gateway.imaging.preprocess import DecodeOptions, preprocess

Pipeline = Callable[[bytes], object]


@dataclass(frozen=True)
class DecodeResult:
    pipeline: str
    dataset: str
    images: int
    seconds: float
    img_per_s: float
    mean_bytes: float


def datasets(quick: bool) -> dict[str, list[bytes]]:
    sizes = (8, 12) if quick else (8, 12, 16, 24)
    per_size = 1 if quick else 2
    baseline, progressive = [], []
    for mp in sizes:
        for i in range(per_size):
            image = photo(*CAMERA_SIZES[mp], seed=mp * 7 + i)
            baseline.append(jpeg(image))
            progressive.append(jpeg(image, progressive=True))
    return {
        "compact-256px": [compact_jpeg(i) for i in range(16 if quick else 48)],
        "camera-baseline": baseline,
        "camera-progressive": progressive,
    }


def naive_pipeline() -> Pipeline:
    """What a straightforward server does: full decode, then open_clip's own transform."""
    import open_clip
    import torch

    torch.set_num_threads(1)
    _, _, transform = open_clip.create_model_and_transforms("ViT-B-32", pretrained=None)

    def run(data: bytes) -> object:
        return transform(Image.open(io.BytesIO(data)).convert("RGB"))

    return run


def gateway_pipeline() -> Pipeline:
    out = np.empty((224, 224, 3), np.uint8)
    options = DecodeOptions(size=224, max_pixels=200_000_000, max_bytes=1 << 30)

    def run(data: bytes) -> object:
        return preprocess(data, out, options)

    return run


def measure(pipeline: Pipeline, images: list[bytes], min_seconds: float) -> tuple[int, float]:
    for data in images[:2]:  # warm caches and lazy imports
        pipeline(data)
    count, started = 0, time.perf_counter()
    while True:
        for data in images:
            pipeline(data)
        count += len(images)
        elapsed = time.perf_counter() - started
        if elapsed >= min_seconds:
            return count, elapsed


def pil_variant() -> str:
    import PIL

    version = PIL.__version__
    return f"pillow-simd {version}" if ".post" in version else f"Pillow {version}"


def run(
    quick: bool = True,
    min_seconds: float | None = None,
    pipelines: tuple[str, ...] = ("naive", "gateway"),
) -> list[dict[str, Any]]:
    """Both pipelines in this process (same PIL for both), one core."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    min_seconds = min_seconds if min_seconds is not None else (1.0 if quick else 4.0)
    sets = datasets(quick)
    factories = {"naive": naive_pipeline, "gateway": gateway_pipeline}
    names = {"naive": "naive-pil-open_clip", "gateway": "gateway"}
    results = []
    for key in pipelines:
        pipeline = factories[key]()
        for dataset, images in sets.items():
            mean_bytes = sum(map(len, images)) / len(images)
            count, seconds = measure(pipeline, images, min_seconds)
            row = asdict(
                DecodeResult(names[key], dataset, count, seconds, count / seconds, mean_bytes)
            )
            results.append(row | {"pil": pil_variant()})
    return results


def child(argv: list[str]) -> int:
    """``python -m bench.harness.child decode [--full] [--pipeline naive|gateway]
    [--min-seconds S] [--json OUT]``: the run study's decode figures, in a process of their own
    (stock Pillow first on the naive pipeline's path)."""
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="python -m bench.harness.child decode")
    parser.add_argument("--full", action="store_true")
    parser.add_argument("--pipeline", choices=("naive", "gateway"), action="append")
    parser.add_argument("--min-seconds", type=float)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rows = run(not args.full, args.min_seconds, tuple(args.pipeline or ("naive", "gateway")))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    for row in rows:
        print(json.dumps(row))
    return 0
