"""Export once, reuse forever: build a cache entry (clip_gateway/model/spec.py says where) with
torch."""

from __future__ import annotations

import json
import logging
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clip_gateway.model.contract import (
    INPUT_NAME,
    OUTPUT_NAME,
    TEXT_CANARY,
    TEXT_INPUT_DTYPE,
    TEXT_INPUT_NAME,
    TEXT_MODEL_NAME,
    TEXT_OUTPUT_NAME,
    TRITON_MODEL_NAME,
    canary_pixels,
    encode_reference,
)
from clip_gateway.model.spec import (
    FP16_FILE,
    FP32_FILE,
    MANIFEST,
    TEXT_FP16_FILE,
    TEXT_FP32_FILE,
    TOKENIZER_FILE,
    ExportedModel,
    UnsupportedModelError,
    Weights,
    cache_entry,
    default_cache_dir,
    export_code_version,
    int8_code_version,
)

if TYPE_CHECKING:  # torch-free at import: a cache hit never loads torch
    from clip_gateway.export.model import LoadedModel
    from clip_gateway.export.tokenizer import TokenizerInfo

log = logging.getLogger(__name__)


def ensure_exported(
    model_name: str,
    weights: Weights,
    cache_dir: Path | None = None,
    *,
    fp16: bool = True,
    force: bool = False,
    int8: bool = False,
    tokenizer: Path | None = None,
) -> ExportedModel:
    """Return the cached export for these inputs, exporting (and parity-checking) it if missing;
    with ``int8``, its INT8 files and gate figures too (added to the entry once). ``tokenizer``:
    a directory with the model's Hugging Face tokenizer files (else they come from the hub)."""
    target = cache_entry(
        model_name, weights, cache_dir or default_cache_dir(), fp16=fp16, tokenizer=tokenizer
    )
    if (target / MANIFEST).exists() and not force:
        log.info("export cache hit: %s", target)
    else:
        _export_entry(target, model_name, weights, fp16, tokenizer)
    exported = ExportedModel.open(target)
    if int8 and (force or (exported.int8 or {}).get("code_version") != int8_code_version()):
        _add_int8(exported, model_name, weights)
        exported = ExportedModel.open(target)
    return exported


def _export_entry(
    target: Path, model_name: str, weights: Weights, fp16: bool, tokenizer: Path | None
) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
    try:
        manifest = _export_into(staging, model_name, weights, fp16, tokenizer)
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        if target.exists():
            shutil.rmtree(target)
        # rename is atomic: a concurrent reader sees either no entry or a complete one.
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _add_int8(exported: ExportedModel, model_name: str, weights: Weights) -> None:
    """Quantize into a staging directory, move the files into the entry, then rewrite the
    manifest: each step is an atomic rename, so a reader sees the old manifest or the new one,
    and the new one only once its files are in place."""
    from clip_gateway.export import int8
    from clip_gateway.export.model import load

    target = exported.directory
    log.info("quantizing %s to INT8 and measuring it on the calibration set", model_name)
    staging = Path(tempfile.mkdtemp(prefix=".staging-int8-", dir=target.parent))
    try:
        section = int8.build(target, exported.manifest, load(model_name, weights), staging)
        section["code_version"] = int8_code_version()
        for name in section["files"].values():
            os.replace(staging / name, target / name)
        manifest = exported.manifest | {"int8": section}
        manifest["files"] = {
            p.name: p.stat().st_size for p in sorted(target.iterdir()) if p.name != MANIFEST
        }
        written = staging / MANIFEST
        written.write_text(json.dumps(manifest, indent=2) + "\n")
        os.replace(written, target / MANIFEST)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _export_into(
    directory: Path, model_name: str, weights: Weights, fp16: bool, tokenizer_dir: Path | None
) -> dict[str, Any]:
    # torch and open_clip are imported here, not at module level, so that a cache hit (e.g. from
    # `make serve`) costs milliseconds rather than a torch import.
    import onnx
    import open_clip
    import torch

    from clip_gateway.export import tokenizer
    from clip_gateway.export.graph import tensorrt_blockers
    from clip_gateway.export.model import load
    from clip_gateway.export.preprocessing import image_preprocessing

    started = time.perf_counter()
    loaded = load(model_name, weights)
    # refused before any export work: a model the gateway would serve approximately
    preprocess = image_preprocessing(model_name, loaded.preprocess_cfg)
    text_side = tokenizer.describe(model_name)
    log.info("exporting %s (%s) to ONNX", model_name, weights.describe())
    image = _export_image(directory, loaded, fp16)
    text = _export_text(directory, model_name, loaded, fp16, text_side, tokenizer_dir)
    files = {p.name: p.stat().st_size for p in sorted(directory.iterdir())}
    # what would keep TensorRT from building one engine of a whole graph
    # (clip_gateway/export/graph.py), recorded rather than fatal: the cpu and cuda profiles serve
    # such a graph fine. Only the FP32 graphs: the tensorrt profile builds its FP16 engines from
    # them; the FP16 files are the CUDA EP's, with ONNX Runtime's fused contrib ops
    # (clip_gateway/export/onnx_export.py)
    blockers = {
        p.name: tensorrt_blockers(onnx.load(str(p), load_external_data=False))
        for p in sorted(directory.glob("*.onnx"))
        if not p.stem.endswith("_fp16")
    }
    for name, found in blockers.items():
        for blocker in found:
            log.warning("%s: TensorRT cannot take the whole graph: %s", name, blocker)
    return {
        "model": model_name,
        "weights": {"kind": weights.kind, "value": weights.value, "id": weights.cache_id()},
        "export_code_version": export_code_version(),
        "opset": image["opset"],
        # the image tower's contract, as before the text tower (readers of older manifests)
        "image_size": loaded.image_size,
        "embed_dim": loaded.embed_dim,
        "mean": loaded.mean,
        "std": loaded.std,
        "interpolation": loaded.interpolation,
        "context_length": text["context_length"],
        # what the gateway must do to an image before the graph, from the model's own config
        "preprocess": preprocess | {"from_tag": loaded.preprocess_tag},
        "towers": {"image": image["tower"], "text": text["tower"]},
        "tokenizer": text["tokenizer"],
        "files": files,
        "nodes": image["nodes"],
        "export_seconds": {
            "fp32": image["fp32_seconds"],
            "text": text["seconds"],
            "total": round(time.perf_counter() - started, 2),
        },
        # the image tower's, kept at the top level for readers of older manifests
        "parity": image["tower"]["parity"],
        "tensorrt_blockers": blockers,
        # what /readyz's canary must keep getting back (clip_gateway/pipeline/canary.py)
        "canary_embedding": image["tower"]["canary_embedding"],
        "versions": {
            "torch": torch.__version__,
            "open_clip": open_clip.__version__,
            "python": platform.python_version(),
        },
    }


def _export_image(directory: Path, loaded: LoadedModel, fp16: bool) -> dict[str, Any]:
    from clip_gateway.export import onnx_export, parity

    started = time.perf_counter()
    fp32_model = onnx_export.export_fp32(loaded.encoder, loaded.image_size, directory / FP32_FILE)
    fp32_seconds = time.perf_counter() - started
    fp16_path = None
    if fp16:
        onnx_export.convert_fp16(fp32_model, directory / FP16_FILE)
        fp16_path = directory / FP16_FILE
    report = parity.measure(loaded, directory / FP32_FILE, fp16_path)
    if not report.ok:
        raise RuntimeError(f"exported image graph failed its parity check: {report.as_dict()}")
    canary = parity.session(directory / FP32_FILE).run(
        None, {INPUT_NAME: canary_pixels(loaded.image_size)}
    )[0][0]
    size = loaded.image_size
    tower = _tower(
        TRITON_MODEL_NAME,
        FP32_FILE,
        fp16_path,
        (INPUT_NAME, "uint8", [-1, size, size, 3]),
        (OUTPUT_NAME, loaded.embed_dim),
    )
    # what /readyz's canary must keep getting back (clip_gateway/pipeline/canary.py)
    tower |= {"parity": report.as_dict(), "canary_embedding": encode_reference(canary)}
    return {
        "tower": tower,
        "opset": onnx_export.OPSET,
        "nodes": len(fp32_model.graph.node),
        "fp32_seconds": round(fp32_seconds, 2),
    }


def _export_text(
    directory: Path,
    model_name: str,
    loaded: LoadedModel,
    fp16: bool,
    side: TokenizerInfo,
    tokenizer_dir: Path | None,
) -> dict[str, Any]:
    """The text tower, always (its graph needs no tokenizer); the tokenizer file and the canary
    only where the gateway can tokenise for this model."""
    import numpy as np

    from clip_gateway.export import onnx_export, parity, tokenizer
    from clip_gateway.export.text import TokenEncoder, context_length, vocab_size

    started = time.perf_counter()
    length = context_length(loaded.clip)
    if length != side.context_length:
        raise RuntimeError(f"text tower takes {length} tokens, its tokenizer {side.context_length}")
    fp32_model = onnx_export.export_text_fp32(
        TokenEncoder(loaded.clip).eval(), length, directory / TEXT_FP32_FILE
    )
    fp16_path = None
    if fp16:
        onnx_export.convert_fp16(fp32_model, directory / TEXT_FP16_FILE)
        fp16_path = directory / TEXT_FP16_FILE
    # random ids exercise every position and the whole vocabulary; real texts the framing
    tokens = np.random.default_rng(0).integers(0, vocab_size(loaded.clip), size=(6, length))
    described = _write_tokenizer(directory, model_name, side, length, tokenizer_dir)
    canary = None
    if described["available"]:
        ours = tokenizer.served_tokenizer(directory, described)
        texts_tokens = ours.tokenize(PARITY_TEXTS)
        if texts_tokens.max() >= vocab_size(loaded.clip):
            raise RuntimeError(
                f"the tokenizer gives ids up to {texts_tokens.max()}, the text tower takes "
                f"{vocab_size(loaded.clip)}: not this model's tokenizer"
            )
        tokens = np.concatenate([texts_tokens, tokens])
        canary = parity.session(directory / TEXT_FP32_FILE).run(
            None, {TEXT_INPUT_NAME: ours.tokenize([TEXT_CANARY])}
        )[0][0]
    report = parity.measure_text(loaded, directory / TEXT_FP32_FILE, fp16_path, tokens)
    if not report.ok:
        raise RuntimeError(f"exported text graph failed its parity check: {report.as_dict()}")
    tower = _tower(
        TEXT_MODEL_NAME,
        TEXT_FP32_FILE,
        fp16_path,
        (TEXT_INPUT_NAME, TEXT_INPUT_DTYPE.name, [-1, length]),
        (TEXT_OUTPUT_NAME, loaded.embed_dim),
    )
    tower["parity"] = report.as_dict()
    if canary is not None:
        tower |= {"canary_text": TEXT_CANARY, "canary_embedding": encode_reference(canary)}
    return {
        "tower": tower,
        "tokenizer": described,
        "context_length": length,
        "seconds": round(time.perf_counter() - started, 2),
    }


def _write_tokenizer(
    directory: Path, model_name: str, side: TokenizerInfo, length: int, tokenizer_dir: Path | None
) -> dict[str, Any]:
    """The tokenizer file and the manifest's ``tokenizer`` section, or why text is not served.
    A directory given for a model that needs none, or without the files, is an error."""
    from clip_gateway.export import hf_tokenizer, tokenizer

    described: dict[str, Any] = {"kind": side.kind, "context_length": length}
    if side.pooling:
        described["pooling"] = side.pooling
    if side.hf_name:
        described["hf_name"] = side.hf_name
    if tokenizer_dir is not None and side.kind != "hf":
        raise UnsupportedModelError(
            f"a tokenizer directory ({tokenizer_dir}) was given, but this model's text tower "
            f"uses open_clip's {side.kind} tokenizer, not a Hugging Face one"
        )
    if not side.available:
        return described | {"available": False, "reason": side.unavailable_reason}
    if side.kind != "hf":
        tokenizer.write_clip_bpe(directory / TOKENIZER_FILE)
        check = tokenizer.check_against_open_clip(
            directory / TOKENIZER_FILE, length, tokenizer.self_check_texts()
        )
        return described | {
            "available": True, "file": TOKENIZER_FILE, "clean": "lower", "self_check": check,
        }  # fmt: skip
    assert side.hf_name is not None
    try:
        source, origin = hf_tokenizer.find_source(model_name, side.hf_name, tokenizer_dir)
    except hf_tokenizer.TokenizerFilesMissing as exc:
        if tokenizer_dir is not None:  # asked for and not there: never a silent images-only
            raise UnsupportedModelError(str(exc)) from exc
        log.warning("%s; this export serves images only", exc)
        return described | {"available": False, "reason": f"{exc}; this export serves images only"}
    framing = hf_tokenizer.write(source, directory, TOKENIZER_FILE, length, side.options)
    check = hf_tokenizer.check(
        directory / TOKENIZER_FILE, source, length, side.options, tokenizer.self_check_texts()
    )
    return described | framing | {
        "available": True, "file": TOKENIZER_FILE, "source": origin, "self_check": check,
    }  # fmt: skip


def _tower(
    triton_model: str,
    fp32_file: str,
    fp16_path: Path | None,
    tensor_in: tuple[str, str, list[int]],
    tensor_out: tuple[str, int],
) -> dict[str, Any]:
    """A tower's files and tensor contract; -1 is the dynamic batch axis."""
    import onnx

    from clip_gateway.export.onnx_export import fused_ops

    fused = fused_ops(onnx.load(str(fp16_path))) if fp16_path else None
    return {
        "triton_model": triton_model,
        "files": {"fp32": fp32_file, "fp16": fp16_path.name if fp16_path else None},
        "input": {"name": tensor_in[0], "dtype": tensor_in[1], "shape": tensor_in[2]},
        "output": {"name": tensor_out[0], "dtype": "float32", "shape": [-1, tensor_out[1]]},
        # ONNX Runtime's fused ops in the FP16 graph (clip_gateway/export/onnx_export.py
        # convert_fp16)
        "fp16_fused_ops": fused,
    }


#: Texts the text parity check runs besides random ids (after the tokenizer's own self-check).
PARITY_TEXTS = ["a photo of a cat", "a diagram", "x" * 300, ""]
