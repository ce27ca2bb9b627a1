"""The ``cpu-bf16`` profile: where it may run (the CPU's flags) and its gate's figures.

OpenVINO runs the export's FP32 graphs with BF16 matrix products on CPUs that have AVX-512 BF16
or AMX (docs/PERFORMANCE.md: 1.68x the images per CPU-second of ``cpu-int8`` at better fidelity
on such a CPU). Elsewhere it would emulate or silently run FP32, so ``auto`` picks it only when
``/proc/cpuinfo`` shows the units, and an explicit ``cpu-bf16`` without them is refused.

The gate is INT8's (clip_gateway/model/gate.py, the same thresholds; profiles/gates.py): per
tower, BF16 vs FP32 cosine on the calibration set (clip_gateway/model/calibration.py), measured at
the first ``cpu-bf16`` start in the Triton env's interpreter (triton/python/bf16_check.py) and
kept beside the export for that OpenVINO version (``bf16.json``); every start holds the figures
to its own thresholds.
"""

from __future__ import annotations

import json
import logging
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from clip_gateway.config.machine import cpu_flags as cpu_flags  # the CPU's units, read here
from clip_gateway.model import calibration, gate

log = logging.getLogger(__name__)

#: /proc/cpuinfo flags of BF16 units OpenVINO's CPU plugin runs BF16 matrix products on.
BF16_FLAGS = ("amx_bf16", "avx512_bf16")
#: The calibration set, as the INT8 gate's (clip_gateway/export/int8.py).
PHOTOS, TEXTS, SEED = 48, 96, 0
RECORD = "bf16.json"
CHECK_SECONDS = 600.0


class Bf16Unavailable(RuntimeError):
    """The gate could not be measured: no OpenVINO, or it failed; the message says why."""


def bf16_flag(flags: frozenset[str]) -> str | None:
    """The BF16 unit among ``flags`` (AMX first), or None."""
    return next((flag for flag in BF16_FLAGS if flag in flags), None)


def calibration_inputs(
    manifest: dict[str, Any],
    export_dir: Path,
    photos: int = PHOTOS,
    texts: int = TEXTS,
    seed: int = SEED,
) -> dict[str, np.ndarray]:
    """The calibration photos resized (short side, bicubic) and centre-cropped to the model's
    input, and the captions' token ids where the export has a usable tokenizer."""
    size = int(manifest["image_size"])
    crops = []
    for photo in calibration.photos(photos, seed):
        scale = size / min(photo.size)
        width = max(size, round(photo.width * scale))
        height = max(size, round(photo.height * scale))
        resized = photo.resize((width, height), Image.Resampling.BICUBIC)
        left, top = (width - size) // 2, (height - size) // 2
        crops.append(np.asarray(resized.crop((left, top, left + size, top + size)), np.uint8))
    inputs = {"image": np.stack(crops)}
    tokenizer = manifest.get("tokenizer") or {}
    if "text" in manifest.get("towers", {}) and tokenizer.get("available"):
        from clip_gateway.text.tokenizer import ClipBpeTokenizer

        ours = ClipBpeTokenizer.from_file(
            export_dir / tokenizer["file"], manifest["context_length"]
        )
        inputs["text"] = ours.tokenize(calibration.texts(texts, seed))
    return inputs


def openvino_version(python: Path) -> str:
    """OpenVINO's version in the Triton env (from its metadata, without importing it)."""
    done = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('openvino'))"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0:
        raise Bf16Unavailable(
            f"OpenVINO is not installed in the Triton env ({python}): `make triton-env` "
            "installs it (requirements/triton-env.txt)"
        )
    return done.stdout.strip()


def measure(
    export_dir: Path,
    python: Path,
    script: Path,
    threads: int,
    *,
    timeout: float = CHECK_SECONDS,
    stop: Callable[[], bool] = lambda: False,
) -> dict[str, Any]:
    """Per tower, BF16 (OpenVINO) vs FP32 (ONNX Runtime) cosine on the calibration set; the
    check is ended if it outlasts ``timeout`` or ``stop()`` says the launch is being stopped."""
    manifest = json.loads((export_dir / "manifest.json").read_text())
    inputs = calibration_inputs(manifest, export_dir)
    with tempfile.TemporaryDirectory(prefix="clip-gateway-bf16-") as scratch:
        feed, out, err = (Path(scratch) / name for name in ("inputs.npz", "out.npz", "err.txt"))
        np.savez(feed, **inputs)  # type: ignore[arg-type]
        command = [str(python), str(script), str(export_dir), str(feed), str(out), str(threads)]
        run_check(command, err, timeout, stop, "the BF16 check", Bf16Unavailable)
        embeddings = dict(np.load(out))
    sets = {
        "image": f"{PHOTOS} generated photos (clip_gateway/model/calibration.py), resized and"
        " centre-cropped",
        "text": f"{TEXTS} generated captions (clip_gateway/model/calibration.py)",
    }
    return {
        tower: {
            "set": sets[tower],
            "vs_fp32": gate.stats(
                gate.cosine(embeddings[f"bf16_{tower}"], embeddings[f"fp32_{tower}"])
            ),
        }
        for tower in inputs
    }


def run_check(
    command: list[str],
    err: Path,
    timeout: float,
    stop: Callable[[], bool],
    what: str,
    error: type[RuntimeError],
) -> None:
    """Run a check in the Triton env's interpreter: ended (``error``) if it outlasts
    ``timeout`` or ``stop()`` says the launch is being stopped; its last error line if it fails."""
    with open(err, "wb") as errors:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=errors)
        ends = time.monotonic() + timeout
        while process.poll() is None:
            if stop() or time.monotonic() >= ends:
                process.kill()
                process.wait()
                why = "the launch was stopped" if stop() else f"it took over {timeout:.0f} s"
                raise error(f"{what} was ended: {why}")
            time.sleep(0.2)
    if process.returncode != 0:
        lines = err.read_text(errors="replace").strip().splitlines() or ["(no output)"]
        raise error(f"{what} failed: {lines[-1]}")


def figures(
    export_dir: Path,
    python: Path,
    script: Path,
    threads: int,
    *,
    timeout: float = CHECK_SECONDS,
    stop: Callable[[], bool] = lambda: False,
) -> tuple[str, dict[str, Any]]:
    """(OpenVINO version, figures): recorded beside the export for this version, else measured
    now and recorded (a read-only export directory is measured at every start)."""
    version = openvino_version(python)
    record = export_dir / RECORD
    try:
        kept = json.loads(record.read_text())
        if kept.get("openvino") == version and kept.get("figures"):
            return version, dict(kept["figures"])
    except (OSError, ValueError):
        pass
    log.info("measuring OpenVINO %s BF16 against FP32 on the calibration set", version)
    measured = measure(export_dir, python, script, threads, timeout=timeout, stop=stop)
    try:
        record.write_text(json.dumps({"openvino": version, "figures": measured}, indent=1))
    except OSError as exc:
        log.warning("cannot keep the BF16 figures beside the export (%s)", exc)
    return version, measured


def section(
    version: str | None,
    measured: dict[str, Any],
    thresholds: gate.Thresholds,
    fallback: str | None,
) -> dict[str, Any]:
    """What the renderer writes into /v1/models (clip_gateway/launcher/repository.py
    ``_precision``)."""
    return {
        "openvino": version,
        "figures": measured,
        "thresholds": thresholds.as_dict(),
        "fallback": fallback,
    }
