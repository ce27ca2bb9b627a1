"""``python -m bench decode-factors``: the CPU seconds one decode + resize to 224 px costs, per
format and coding, on flat and noisy images (thread CPU time, best of 3, one thread): the
figures behind imaging/work.py's FACTORS (docs/ADMISSION.md), then the model's price against
the measured time on files of every class, the issue-31 classes included, at the factors and at
this machine's decode speed (pipeline/decode_speed.py, what a gateway started here prices by).
``--check`` runs only that check and fails unless every class is within 2x of its price here:
a verdict on the machine that runs it, so it lives here, not in the tests (issue 42).
``--first N``: a first compact JPEG's cost over the next in N fresh processes, warmed and cold.

Each JPEG factor is fitted on files of its own class, where its term dominates: the output per
decoded pixel and the baseline pass per block on flat baseline strips (no DCT scaling) and flat
wide images (1/8 scale); the resize on a flat image decoded whole (Immich's plan); the
progressive, arithmetic and arithmetic-progressive passes per block and scan on flat strips of
their coding; the per-byte factors on noisy photos. Arithmetic-coded JPEGs are made with
libjpeg-turbo's ``jpegtran -arithmetic`` (``apt-get install libjpeg-turbo-progs``). Writes
bench/results/decode_factors/factors.json and .md."""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from opentelemetry.trace import NoOpTracer
from PIL import Image

from bench.harness import output, photos, study
from bench.harness.photos import photo
from clip_gateway.imaging import jpeg, work
from clip_gateway.imaging.preprocess import DecodeOptions, preprocess
from clip_gateway.observability.metrics import Metrics
from clip_gateway.pipeline import batching, decode_speed
from tests import samples

OPTIONS = DecodeOptions(
    size=224, max_pixels=100_000_000, max_bytes=64 << 20, max_decode_bytes=4 << 30
)
IMMICH = replace(OPTIONS, variant="immich")
CODINGS: dict[str, tuple[str, dict[str, object]]] = {
    "png": ("PNG", {}),
    "webp-lossy": ("WEBP", {"quality": 80}),
    "webp-lossless": ("WEBP", {"lossless": True}),
    "gif": ("GIF", {}),
}
FLAT = (120, 130, 140)


def cpu_s(data: bytes, options: DecodeOptions = OPTIONS, reps: int = 3) -> float:
    """Best of ``reps`` decodes' thread CPU time (what the gateway's meter counts)."""
    out = np.empty((224, 224, 3), np.uint8)
    best = float("inf")
    for _ in range(reps):
        start = time.thread_time()
        preprocess(data, out, options)
        best = min(best, time.thread_time() - start)
    return best


def arithmetic(data: bytes) -> bytes:
    """``data`` re-coded with arithmetic coding, keeping its progression."""
    try:
        return photos.arithmetic(data, progressive=jpeg.frame(data).progressive)
    except FileNotFoundError as exc:
        raise SystemExit(str(exc)) from None


def flat_jpeg(width: int, height: int, **options: object) -> bytes:
    return samples.encode(Image.new("RGB", (width, height), FLAT), "JPEG", **options)


def photo_jpeg(width: int, height: int, **options: object) -> bytes:
    return samples.encode(photo(width, height, seed=1).convert("RGB"), "JPEG", **options)


def terms(data: bytes, options: DecodeOptions = OPTIONS) -> dict[str, float]:
    """The model's quantities for a JPEG under ``options``: block passes, output pixels,
    resized pixels, bytes."""
    plan = options.plan
    layout = jpeg.walk(data, max_scans=plan.max_scans)
    divisor = work.scale(layout.width, layout.height, plan)
    if not layout.progressive:
        passes = 1
    elif plan.dc_only and divisor == 8:
        passes = max(1, layout.dc_scans)
    else:
        passes = layout.scans
    width, height = -(-layout.width // divisor), -(-layout.height // divisor)
    return {
        "block_passes": layout.blocks * passes,
        "output_px": width * height,
        "resize_px": work.resize_pixels(width, height, plan),
        "bytes": len(data),
    }


def fit() -> dict[str, float]:
    """Each JPEG factor from files of its class (seconds per unit)."""
    f: dict[str, float] = {}
    strip = flat_jpeg(224, 40_000)  # no DCT scaling: output dominates
    wide = flat_jpeg(8000, 2000)  # 1/8: block passes dominate
    t_strip, t_wide = cpu_s(strip), cpu_s(wide)
    a, b = terms(strip), terms(wide)
    # two equations (ignoring the small resize of ``wide``): solve for per-block and per-pixel
    matrix = np.array([[a["block_passes"], a["output_px"]], [b["block_passes"], b["output_px"]]])
    f["baseline_block"], f["output_px"] = (float(v) for v in np.linalg.solve(
        matrix, [t_strip, t_wide - 3e-9 * b["resize_px"]]))  # fmt: skip
    print(f"strip {t_strip * 1e3:.1f} ms, wide {t_wide * 1e3:.1f} ms", flush=True)
    whole = flat_jpeg(6000, 6000)  # Immich: every pixel, one-step resize of the centre square
    t = cpu_s(whole, IMMICH)
    w = terms(whole, IMMICH)
    rest = f["baseline_block"] * w["block_passes"] + f["output_px"] * w["output_px"]
    f["resize_px"] = (t - rest) / w["resize_px"]
    for name, data in (
        ("progressive_block", flat_jpeg(224, 40_000, progressive=True)),
        ("arithmetic_block", arithmetic(strip)),
        ("arithmetic_progressive_block", arithmetic(flat_jpeg(224, 40_000, progressive=True))),
    ):
        t, q = cpu_s(data), terms(data)
        f[name] = (t - f["output_px"] * q["output_px"]) / q["block_passes"]
        print(f"{name}: {len(data)} B, {t * 1e3:.1f} ms", flush=True)
    for name, block, data in (
        ("baseline_byte", "baseline_block", photo_jpeg(2000, 1500)),
        ("progressive_byte", "progressive_block", photo_jpeg(2000, 1500, progressive=True)),
        ("arithmetic_byte", "arithmetic_block", arithmetic(photo_jpeg(2000, 1500))),
        ("arithmetic_progressive_byte", "arithmetic_progressive_block",
         arithmetic(photo_jpeg(2000, 1500, progressive=True))),
    ):  # fmt: skip
        t, q = cpu_s(data), terms(data)
        rest = (f[block] * q["block_passes"] + f["output_px"] * q["output_px"]
                + f["resize_px"] * q["resize_px"])  # fmt: skip
        f[name] = max(0.0, (t - rest) / q["bytes"])
        print(f"{name}: {len(data)} B, {t * 1e3:.1f} ms", flush=True)
    return f


def others() -> dict[str, dict[str, float]]:
    """PNG, WebP and GIF: per source pixel (flat 12 MP) and per byte (noisy 3 MP)."""
    found: dict[str, dict[str, float]] = {}
    for coding, (fmt, options) in CODINGS.items():
        flat = Image.new("RGB", (4000, 3000), FLAT)
        noisy = photo(2000, 1500, seed=1).convert("RGB")
        if fmt == "GIF":
            flat, noisy = flat.convert("P"), noisy.convert("P")
        flat_data = samples.encode(flat, fmt, **options)
        noisy_data = samples.encode(noisy, fmt, **options)
        per_px = cpu_s(flat_data) / 12e6
        per_byte = max(0.0, (cpu_s(noisy_data) - per_px * 3e6) / len(noisy_data))
        found[coding] = {"per_pixel_ns": per_px * 1e9, "per_byte_ns": per_byte * 1e9}
        print(coding, found[coding], flush=True)
    return found


def classes() -> dict[str, tuple[bytes, DecodeOptions]]:
    """The files the model is checked on: the classes of issues 23 and 31, photos, Immich."""
    prog_strip = flat_jpeg(224, 40_000, progressive=True)
    return {
        "photo 12 MP baseline": (photo_jpeg(4000, 3000), OPTIONS),
        "photo 12 MP progressive": (photo_jpeg(4000, 3000, progressive=True), OPTIONS),
        "compact 224x298 baseline": (photo_jpeg(224, 298), OPTIONS),
        "flat 100 MP arithmetic (issue 23)": (arithmetic(flat_jpeg(10_000, 10_000)), OPTIONS),
        "flat 224x40000 progressive (issue 31)": (prog_strip, OPTIONS),
        "flat 300x30000 progressive 4:4:4": (
            flat_jpeg(300, 30_000, progressive=True, subsampling=0), OPTIONS),
        "flat 1000x40000 arithmetic progressive (issue 31)": (
            arithmetic(flat_jpeg(1000, 40_000, progressive=True)), OPTIONS),
        "flat 224x40000 arithmetic progressive (issue 31)": (arithmetic(prog_strip), OPTIONS),
        "flat 7900x7900 baseline, /predict (issue 31)": (flat_jpeg(7900, 7900), IMMICH),
        "photo 4000x3000 baseline, /predict": (photo_jpeg(4000, 3000), IMMICH),
    }  # fmt: skip


def check(speeds: dict[str, float]) -> dict[str, dict[str, float]]:
    """Each class measured against its price at the factors and at this machine's decode speed
    for its coding (``speeds``: pipeline/decode_speed.py, what a gateway started here prices
    by)."""
    rows: dict[str, dict[str, float]] = {}
    for name, (data, options) in classes().items():
        measured = cpu_s(data, options)
        priced = work.estimate(data, plan=options.plan)
        here = priced.seconds * speeds[priced.coding]
        rows[name] = {
            "bytes": len(data),
            "measured_ms": round(measured * 1e3, 2),
            "priced_ms": round(priced.seconds * 1e3, 2),
            "measured_over_priced": round(measured / priced.seconds, 2),
            "speed": speeds[priced.coding],
            "measured_over_priced_here": round(measured / here, 2),
        }
        print(name, rows[name], flush=True)
    return rows


def child(argv: list[str]) -> int:
    """``warmed|cold DIR``: a fresh process decodes DIR's JPEGs (encoded elsewhere: an encode
    warms the library) in one decoder thread; prints the first's CPU s and the others' median."""
    with ThreadPoolExecutor(1) as pool:
        if argv[0] == "warmed":
            asyncio.run(batching.BatchDecoder(pool, NoOpTracer(), Metrics()).warm(OPTIONS))
        files = sorted(Path(argv[1]).iterdir())
        spent = [pool.submit(cpu_s, file.read_bytes(), OPTIONS, 1).result() for file in files]
    print(spent[0], statistics.median(spent[1:]))
    return 0


def first_decode(runs: int, out: Path) -> None:
    """Milliseconds a fresh process's first compact JPEG costs over the median of its next five,
    in ``runs`` processes warmed and ``runs`` not, alternating: first_decode.json and .md."""
    found: dict[str, list[float]] = {"warmed": [], "cold": []}
    with tempfile.TemporaryDirectory() as folder:
        for seed in range(6):
            (Path(folder) / f"{seed}.jpg").write_bytes(samples.compact(seed))
        for _, (way, extra) in itertools.product(range(runs), found.items()):
            command = [sys.executable, "-m", "bench.harness.child", "decode_factors", way, folder]
            first, then = map(float, subprocess.check_output(command, text=True).split())
            extra.append(round((first - then) * 1e3, 3))
    table = [f"| {way} | {min(v)} | {statistics.median(v):.3f} | {max(v)} | {len(v)} |"
             for way, v in found.items()]  # fmt: skip
    head = "| decoder | ms over the next: min | median | max | processes |\n" + "| --- " * 5 + "|"
    output.write_results(out, "first_decode", found, markdown="\n".join([head, *table]) + "\n")


def main(argv: list[str]) -> int:
    """Every factor and every check; ``--check``: only the check, at this machine's speed, and
    exit 1 unless every class is within 2x of its price here (the verdict a unit test once
    held against the factors alone, whatever CPU ran it: issue 42)."""
    parser = study.parser("decode-factors", __doc__)
    parser.add_argument("--check", action="store_true", help="only the check; exit 1 outside 2x")
    parser.add_argument("--first", type=int, metavar="N", help="only N first decodes each way")
    args = parser.parse_args(argv)
    out = study.out(args, "decode_factors")
    if args.first:
        first_decode(args.first, out)
        return 0
    speed = decode_speed.measure()
    print("decode speed here:", speed.summary(), flush=True)
    if args.check:
        rows = check(speed.speeds)
        outside = [n for n, r in rows.items() if not 0.5 <= r["measured_over_priced_here"] <= 2]
        print("outside 2x of their price here:", outside or "none", flush=True)
        return 1 if outside else 0
    report: dict[str, Any] = {
        "jpeg_fit_ns": {k: v * 1e9 for k, v in fit().items()},
        "others": others(),
        "speed": speed.speeds,
    }
    print(report["jpeg_fit_ns"], flush=True)
    report["check"] = check(speed.speeds)
    out.mkdir(parents=True, exist_ok=True)
    (out / "factors.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = ["| class | bytes | measured ms | priced ms | measured / priced | speed here | "
             "measured / priced here |", "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for name, row in report["check"].items():
        lines.append(f"| {name} | {row['bytes']} | {row['measured_ms']} | {row['priced_ms']} | "
                     f"{row['measured_over_priced']} | {row['speed']} | "
                     f"{row['measured_over_priced_here']} |")  # fmt: skip
    (out / "factors.md").write_text("\n".join(lines) + "\n")
    return 0
