"""Calibration: measure the GPU profiles on this GPU once, keep the winner beside the engines."""

from __future__ import annotations

import asyncio
import json
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from gateway.backend.contract import TRITON_MODEL_NAME
from gateway.runtime.settings import Profile, Settings


@dataclass(frozen=True)
class Calibration:
    gpu: str
    model: str
    winner: Profile
    #: milliseconds per image at each measured batch size, per profile
    per_image_ms: dict[str, dict[str, float]]


#: Times one profile: milliseconds per image at batch 1 and at max batch: {"1": 2.1, "max": 0.3}.
Timer = Callable[[Profile], dict[str, float]]


def calibrate(gpu: str, model: str, timer: Timer, record: Path) -> Calibration:
    """Measure both GPU profiles on this GPU, keep the faster at max batch (ties: batch 1)."""
    timings = {profile: timer(profile) for profile in ("cuda", "tensorrt")}

    def key(profile: str) -> tuple[float, float]:
        return timings[profile].get("max", float("inf")), timings[profile].get("1", float("inf"))

    winner: Profile = "cuda" if key("cuda") <= key("tensorrt") else "tensorrt"
    result = Calibration(gpu, model, winner, timings)
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(asdict(result), indent=1))
    return result


def recorded(record: Path, gpu: str, model: str) -> Calibration | None:
    """A previous calibration for this GPU and model file, if any."""
    try:
        data = json.loads(record.read_text())
    except (OSError, ValueError):
        return None
    if data.get("gpu") != gpu or data.get("model") != model:
        return None
    return Calibration(**data)


def measure(
    profile: Profile, export_dir: Path, settings: Settings, stop: threading.Event
) -> dict[str, float]:
    """Milliseconds per image at batch 1 and at the max batch, with ``profile`` loaded in a
    tritonserver of its own (started and stopped here, in a private scratch directory)."""
    from gateway.backend.local import LocalTriton
    from gateway.backend.repository import render
    from gateway.backend.triton import TritonBackend

    async def timings(url: str) -> dict[str, float]:
        backend = TritonBackend(url, TRITON_MODEL_NAME)
        try:
            info = await backend.model_info()
            found = {}
            for key, batch in (("1", 1), ("max", info.max_batch_size)):
                pixels = np.random.default_rng(0).integers(
                    0, 256, (batch, info.image_size, info.image_size, 3), dtype=np.uint8
                )
                for _ in range(3):
                    await backend.infer(pixels, deadline=time.monotonic() + 600)
                started = time.perf_counter()
                for _ in range(20):
                    await backend.infer(pixels, deadline=time.monotonic() + 600)
                found[key] = (time.perf_counter() - started) / 20 / batch * 1000
            return found
        finally:
            await backend.close()

    with tempfile.TemporaryDirectory(prefix="clip-gateway-calibrate-") as scratch:
        repository = render(
            settings.repository.model_copy(update={"profile": profile}),
            export_dir,
            Path(scratch) / "model_repository",
        )
        with LocalTriton(repository, inherit_output=True, stop_requested=stop) as triton:
            return asyncio.run(timings(triton.grpc_url))
