"""Parity of the exported graphs against open_clip's own torch pipeline on the same input: uint8
pixels for the image tower, token ids for the text tower."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch
from torchvision.transforms import Normalize

from clip_gateway.export.model import LoadedModel
from clip_gateway.model.contract import INPUT_NAME, TEXT_INPUT_DTYPE, TEXT_INPUT_NAME
from clip_gateway.model.gate import cosine

FP32_MAX_ABS = 1e-4
FP16_MIN_COSINE = 0.999


@dataclass(frozen=True)
class ParityReport:
    batch: int
    fp32_max_abs: float
    fp16_cosine_min: float | None
    fp16_cosine_mean: float | None

    @property
    def ok(self) -> bool:
        fp16_ok = self.fp16_cosine_min is None or self.fp16_cosine_min >= FP16_MIN_COSINE
        return self.fp32_max_abs <= FP32_MAX_ABS and fp16_ok

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"ok": self.ok}


def reference(loaded: LoadedModel, pixels: np.ndarray) -> np.ndarray:
    """open_clip in torch: ToTensor's /255, its Normalize transform, ``encode_image``."""
    x = torch.from_numpy(pixels).permute(0, 3, 1, 2).to(torch.float32) / 255.0
    x = Normalize(loaded.mean, loaded.std)(x)
    with torch.no_grad():
        embedding: torch.Tensor = loaded.clip.encode_image(x)  # type: ignore[operator]
    return embedding.numpy()


def session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    # ORT_ENABLE_ALL adds CPU layout transforms that crash onnxruntime 1.31's CPU EP on the FP16
    # graph (segfault at session creation); EXTENDED keeps every fusion and is what we compare.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def measure(
    loaded: LoadedModel, fp32_path: Path, fp16_path: Path | None, batch: int = 8, seed: int = 0
) -> ParityReport:
    """The image graphs against open_clip on random pixels: a report, judged by the caller."""
    rng = np.random.default_rng(seed)
    size = loaded.image_size
    pixels = rng.integers(0, 256, size=(batch, size, size, 3), dtype=np.uint8)
    return _compare(reference(loaded, pixels), {INPUT_NAME: pixels}, fp32_path, fp16_path)


def reference_text(loaded: LoadedModel, tokens: np.ndarray) -> np.ndarray:
    """open_clip's ``encode_text`` on int64 ids, as its tokenizer hands them over."""
    with torch.no_grad():
        embedding: torch.Tensor = loaded.clip.encode_text(  # type: ignore[operator]
            torch.from_numpy(tokens.astype(np.int64))
        )
    return embedding.numpy()


def measure_text(
    loaded: LoadedModel, fp32_path: Path, fp16_path: Path | None, tokens: np.ndarray
) -> ParityReport:
    """The text graphs against ``encode_text`` on ``tokens`` (real texts and random ids)."""
    tokens = tokens.astype(TEXT_INPUT_DTYPE)
    expected = reference_text(loaded, tokens)
    return _compare(expected, {TEXT_INPUT_NAME: tokens}, fp32_path, fp16_path)


def _compare(
    expected: np.ndarray, feeds: dict[str, np.ndarray], fp32_path: Path, fp16_path: Path | None
) -> ParityReport:
    got32 = session(fp32_path).run(None, feeds)[0]
    cos16_min = cos16_mean = None
    if fp16_path is not None:
        cos = cosine(expected, session(fp16_path).run(None, feeds)[0])
        cos16_min, cos16_mean = float(cos.min()), float(cos.mean())
    return ParityReport(
        batch=len(expected),
        fp32_max_abs=float(np.abs(expected - got32).max()),
        fp16_cosine_min=cos16_min,
        fp16_cosine_mean=cos16_mean,
    )
