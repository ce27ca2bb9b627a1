"""Export once, reuse forever: build a cache entry (export/spec.py says where) with torch."""

from __future__ import annotations

import json
import logging
import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from export.spec import (
    FP16_FILE,
    FP32_FILE,
    MANIFEST,
    ExportedModel,
    Weights,
    cache_entry,
    default_cache_dir,
    export_code_version,
)
from gateway.backend.contract import INPUT_NAME, canary_pixels, encode_reference

log = logging.getLogger(__name__)


def ensure_exported(
    model_name: str,
    weights: Weights,
    cache_dir: Path | None = None,
    *,
    fp16: bool = True,
    force: bool = False,
) -> ExportedModel:
    """Return the cached export for these inputs, exporting (and parity-checking) it if missing."""
    target = cache_entry(model_name, weights, cache_dir or default_cache_dir(), fp16=fp16)
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
    import onnx
    import open_clip
    import torch

    from export import onnx_export, parity
    from export.graph import tensorrt_blockers
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
    # what would keep TensorRT from building one engine of the whole graph (export/graph.py);
    # recorded rather than fatal: the cpu and cuda profiles serve such a graph fine
    blockers = {
        p.name: tensorrt_blockers(onnx.load(str(p), load_external_data=False))
        for p in sorted(directory.glob("*.onnx"))
    }
    for name, found in blockers.items():
        for blocker in found:
            log.warning("%s: TensorRT cannot take the whole graph: %s", name, blocker)
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
        "tensorrt_blockers": blockers,
        # what /readyz's canary must keep getting back (gateway/pipeline/canary.py)
        "canary_embedding": encode_reference(canary),
        "versions": {
            "torch": torch.__version__,
            "open_clip": open_clip.__version__,
            "python": platform.python_version(),
        },
    }
