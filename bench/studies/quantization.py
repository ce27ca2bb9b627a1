"""``python -m bench quantization``: the INT8 methods ONNX Runtime offers, measured on this machine
for both towers: dynamic (``quantize_dynamic``) and static QDQ with calibration
(``quantize_static`` + a CalibrationDataReader over generated photos and captions), each per channel
and per tensor (clip_gateway/export/quantize.py). Per variant: images (texts) per second at batch 32
and milliseconds at batch 1 with 2 threads, and cosine vs FP32 on the gate's calibration set.

The static variants calibrate on a different draw (seed 1) than the one they are judged on
(seed 0, the export gate's set), so they are not graded on the data they were fitted to.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from bench.harness.ceilings import session
from bench.harness.machine import cpu_load as machine
from bench.harness.machine import wait_quiet
from bench.harness.output import write_results
from clip_gateway.export.quantize import Method, quantize
from clip_gateway.model import calibration
from clip_gateway.model.gate import cosine

VARIANTS: dict[str, tuple[Method, bool]] = {
    "dynamic, per channel": ("dynamic", True),
    "dynamic, per tensor": ("dynamic", False),
    "static QDQ, per channel": ("static", True),
    "static QDQ, per tensor": ("static", False),
}


def crops(images: list[Image.Image], size: int = 224) -> np.ndarray:
    """Shorter side to ``size`` (bicubic), centre crop: the uint8 pixels the graph takes."""
    out = []
    for image in images:
        scale = size / min(image.size)
        w, h = max(size, round(image.width * scale)), max(size, round(image.height * scale))
        resized = image.resize((w, h), Image.Resampling.BICUBIC)
        left, top = (w - size) // 2, (h - size) // 2
        out.append(np.asarray(resized.crop((left, top, left + size, top + size))))
    return np.stack(out)


def _speed(path: Path, name: str, batch: np.ndarray, reps: int) -> dict[str, float]:
    run = session(path, 2)
    run.run(None, {name: batch})
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        run.run(None, {name: batch})
        times.append(time.perf_counter() - started)
    single = []
    for _ in range(reps * 4):
        started = time.perf_counter()
        run.run(None, {name: batch[:1]})
        single.append(time.perf_counter() - started)
    return {"batch32_per_s": round(len(batch) / float(np.median(times)), 1),
            "batch1_ms": round(float(np.median(single)) * 1000, 1)}  # fmt: skip


def tower(fp32: Path, name: str, judged: np.ndarray, fitted: np.ndarray, work: Path,
          reps: int) -> dict[str, Any]:  # fmt: skip
    """Every variant of one tower: speed and cosine vs FP32."""
    exact = session(fp32, 2).run(None, {name: judged})[0]
    found: dict[str, Any] = {"fp32": _speed(fp32, name, judged[:32], reps)}
    for label, (method, per_channel) in VARIANTS.items():
        target = work / f"{fp32.stem}-{method}-{per_channel}.onnx"
        feeds = [{name: fitted[i : i + 8]} for i in range(0, len(fitted), 8)]
        started = time.perf_counter()
        quantize(method, fp32, target, per_channel=per_channel, calibration=feeds)
        seconds = time.perf_counter() - started
        got = session(target, 2).run(None, {name: judged})[0]
        found[label] = _speed(target, name, judged[:32], reps) | {
            "cosine_vs_fp32": {"mean": round(float(cosine(got, exact).mean()), 6),
                               "min": round(float(cosine(got, exact).min()), 6)},
            "quantize_s": round(seconds, 1),
            "mbytes": round(target.stat().st_size / 1e6, 1),
        }  # fmt: skip
        print(json.dumps({"tower": fp32.name, "variant": label} | found[label]), flush=True)
    return found


def run(out: Path, reps: int = 5) -> dict[str, Any]:
    from clip_gateway.export.build import ensure_exported
    from clip_gateway.model.spec import Weights
    from clip_gateway.text.tokenizer import ClipBpeTokenizer

    exported = ensure_exported("ViT-B-32", Weights.random(0), int8=True)
    directory = exported.directory
    results: dict[str, Any] = {"machine": machine(), "command": "python -m bench quantization"}
    tokenizer = ClipBpeTokenizer.from_file(
        directory / "tokenizer.json", exported.manifest["context_length"]
    )
    with tempfile.TemporaryDirectory(prefix="bench-int8-") as tmp:
        results["before"] = wait_quiet(600)
        results["image"] = tower(directory / "model.onnx", "pixels",
                                 crops(calibration.photos(48, 0)),
                                 crops(calibration.photos(64, 1)), Path(tmp), reps)  # fmt: skip
        results["text"] = tower(directory / "text.onnx", "tokens",
                                tokenizer.tokenize(calibration.texts(96, 0)),
                                tokenizer.tokenize(calibration.texts(96, 1)), Path(tmp),
                                reps)  # fmt: skip
    results["machine"]["load_avg_after"] = list(os.getloadavg())
    write_results(out, "quantization", results, markdown=markdown(results))
    return results


def markdown(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        "# INT8 methods (ONNX Runtime quantization), ViT-B/32 random weights",
        "",
        f"{m['cpu_model']}, nproc {m['nproc']}, load average {results['before']['load_1m']} at "
        f"the start. `{results['command']}`. 2 ORT threads; cosine vs FP32 on the export gate's "
        "set (48 generated photos, 96 captions); static variants calibrated on another draw.",
    ]
    for kind, unit in (("image", "img/s"), ("text", "texts/s")):
        found = results[kind]
        fp32 = found["fp32"]
        lines += [
            "",
            f"**{kind} tower**",
            "",
            f"| variant | batch 32 {unit} | batch 1 ms | cosine mean | cosine min | quantize s "
            "| MB |",
            "| --- | --- | --- | --- | --- | --- | --- |",
            f"| FP32 | {fp32['batch32_per_s']} | {fp32['batch1_ms']} | 1 | 1 | – | – |",
        ]
        for label in VARIANTS:
            v = found[label]
            lines.append(f"| {label} | {v['batch32_per_s']} | {v['batch1_ms']} | "
                         f"{v['cosine_vs_fp32']['mean']} | {v['cosine_vs_fp32']['min']} | "
                         f"{v['quantize_s']} | {v['mbytes']} |")  # fmt: skip
    return "\n".join(lines) + "\n"
