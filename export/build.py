"""Export once, reuse forever: a cache keyed by model, weights and the export code's own version."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from export.model import Weights
from gateway.canary import canary_pixels, encode_reference
from gateway.contract import INPUT_NAME

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
FP32_FILE = "model.onnx"
FP16_FILE = "model_fp16.onnx"
# Sources whose text decides the exported bytes: a change to any of them is a new cache entry.
_VERSIONED_SOURCES = (
    "export/model.py",
    "export/onnx_export.py",
    "gateway/contract.py",
    "gateway/canary.py",
)


def default_cache_dir() -> Path:
    if explicit := os.environ.get("CLIP_GATEWAY_CACHE"):
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "clip-gateway"


def export_code_version() -> str:
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for rel in _VERSIONED_SOURCES:
        digest.update((root / rel).read_bytes())
    return digest.hexdigest()[:12]


@dataclass(frozen=True)
class ExportedModel:
    """A finished export: its directory, the two ONNX files and what was recorded about them."""

    directory: Path
    manifest: dict[str, Any]

    @property
    def fp32(self) -> Path:
        return self.directory / FP32_FILE

    @property
    def fp16(self) -> Path | None:
        path = self.directory / FP16_FILE
        return path if path.exists() else None

    @classmethod
    def open(cls, directory: Path) -> ExportedModel:
        return cls(directory, json.loads((directory / MANIFEST).read_text()))


def cache_key(model_name: str, weights: Weights, fp16: bool) -> str:
    material = json.dumps(
        [model_name, weights.cache_id(), export_code_version(), fp16], separators=(",", ":")
    )
    return hashlib.sha256(material.encode()).hexdigest()[:16]


def ensure_exported(
    model_name: str,
    weights: Weights,
    cache_dir: Path | None = None,
    *,
    fp16: bool = True,
    force: bool = False,
) -> ExportedModel:
    """Return the cached export for these inputs, exporting (and parity-checking) it if missing."""
    cache_dir = cache_dir or default_cache_dir()
    target = cache_dir / "models" / f"{model_name}-{cache_key(model_name, weights, fp16)}"
    if (target / MANIFEST).exists() and not force:
        log.info("export cache hit: %s", target)
        return ExportedModel.open(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
    try:
        manifest = _export_into(staging, model_name, weights, fp16)
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        if target.exists():
            shutil.rmtree(target)
        # rename is atomic: a concurrent reader sees either no entry or a complete one.
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return ExportedModel.open(target)


def _export_into(directory: Path, model_name: str, weights: Weights, fp16: bool) -> dict[str, Any]:
    # torch and open_clip are imported here, not at module level, so that a cache hit (e.g. from
    # `make serve`) costs milliseconds rather than a torch import.
    import open_clip
    import torch

    from export import onnx_export, parity
    from export.model import load

    started = time.perf_counter()
    loaded = load(model_name, weights)
    log.info("exporting %s (%s) to ONNX", model_name, weights.describe())
    fp32_model = onnx_export.export_fp32(loaded.encoder, loaded.image_size, directory / FP32_FILE)
    fp32_seconds = time.perf_counter() - started
    fp16_path = None
    if fp16:
        onnx_export.convert_fp16(fp32_model, directory / FP16_FILE)
        fp16_path = directory / FP16_FILE
    export_seconds = time.perf_counter() - started
    report = parity.check(loaded, directory / FP32_FILE, fp16_path)
    if not report.ok:
        raise RuntimeError(f"exported graph failed its parity check: {report.as_dict()}")
    files = {p.name: p.stat().st_size for p in sorted(directory.glob("*.onnx"))}
    canary = parity.session(directory / FP32_FILE).run(
        None, {INPUT_NAME: canary_pixels(loaded.image_size)}
    )[0][0]
    return {
        "model": model_name,
        "weights": {"kind": weights.kind, "value": weights.value, "id": weights.cache_id()},
        "export_code_version": export_code_version(),
        "opset": onnx_export.OPSET,
        "image_size": loaded.image_size,
        "embed_dim": loaded.embed_dim,
        "mean": loaded.mean,
        "std": loaded.std,
        "interpolation": loaded.interpolation,
        "files": files,
        "nodes": len(fp32_model.graph.node),
        "export_seconds": {"fp32": round(fp32_seconds, 2), "total": round(export_seconds, 2)},
        "parity": report.as_dict(),
        # what /readyz's canary must keep getting back (gateway/canary.py)
        "canary_embedding": encode_reference(canary),
        "versions": {
            "torch": torch.__version__,
            "open_clip": open_clip.__version__,
            "python": platform.python_version(),
        },
    }
