"""``python -m clip_gateway.export --int8``: quantize both towers of a finished export
(clip_gateway/export/quantize.py), measure them on the calibration set
(clip_gateway/model/calibration.py) against the FP32 graphs and open_clip's own pipeline, and record
what the gate (clip_gateway/model/gate.py) needs in the manifest's ``int8`` section.

Runs in the exporter's process (torch: the open_clip reference). The INT8 files and their
figures are kept whatever the gate says, so a launcher with other thresholds needs no new
export; no profile renders a refused INT8 file.
"""

from __future__ import annotations

import time
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch

from clip_gateway.export.model import LoadedModel
from clip_gateway.export.quantize import DEFAULT_METHOD, Method, quantize
from clip_gateway.model import calibration, gate
from clip_gateway.model.contract import (
    INPUT_NAME,
    TEXT_CANARY,
    TEXT_INPUT_NAME,
    canary_pixels,
    encode_reference,
)
from clip_gateway.model.spec import FP32_FILE, INT8_FILE, TEXT_FP32_FILE, TEXT_INT8_FILE

#: The calibration set: photos and captions, generated (clip_gateway/model/calibration.py).
PHOTOS, TEXTS, SEED = 48, 96, 0


def session(path: Path) -> ort.InferenceSession:
    """As the cpu profile runs it (triton/python/model.py): ORT's default, every optimisation."""
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def build(
    directory: Path,
    manifest: dict[str, Any],
    loaded: LoadedModel,
    staging: Path,
    method: Method = DEFAULT_METHOD,
    thresholds: gate.Thresholds | None = None,
) -> dict[str, Any]:
    """Quantize into ``staging`` (the caller moves the files into ``directory``); the manifest's
    ``int8`` section: method, files, figures per tower, canaries, and the gate's verdict."""
    thresholds = thresholds or gate.Thresholds()
    started = time.perf_counter()
    files, figures, canaries = {}, {}, {}
    quantize(method, directory / FP32_FILE, staging / INT8_FILE)
    files["image"] = INT8_FILE
    figures["image"], canaries["image"] = _image_figures(
        loaded, directory / FP32_FILE, staging / INT8_FILE
    )
    if manifest.get("tokenizer", {}).get("available"):
        quantize(method, directory / TEXT_FP32_FILE, staging / TEXT_INT8_FILE)
        files["text"] = TEXT_INT8_FILE
        figures["text"], canaries["text"] = _text_figures(
            loaded, manifest, directory, staging / TEXT_INT8_FILE
        )
    reason = gate.refusal(figures, thresholds)
    return {
        "method": method,
        "per_channel": True,
        "weights": "int8, per output channel" if method == "dynamic" else "int8, static QDQ",
        "activations": "uint8, per tensor, at run time" if method == "dynamic" else "calibrated",
        "files": files,
        "calibration": {"photos": PHOTOS, "texts": TEXTS, "seed": SEED, "kind": "generated"},
        "figures": figures,
        "thresholds": thresholds.as_dict(),
        "accepted": reason is None,
        "reason": reason,
        "canary_embedding": canaries,
        "seconds": round(time.perf_counter() - started, 2),
    }


def _image_figures(loaded: LoadedModel, fp32: Path, int8: Path) -> tuple[dict[str, Any], str]:
    from open_clip.transform import PreprocessCfg, image_transform_v2

    names = {f.name for f in fields(PreprocessCfg)}
    cfg = PreprocessCfg(**{k: v for k, v in loaded.preprocess_cfg.items() if k in names})
    transform = image_transform_v2(cfg, is_train=False)
    # open_clip's own pipeline: its resize and crop, then ToTensor + Normalize + encode_image;
    # the graphs get the same crop as uint8 (their input), which is all they ever see
    steps = transform.transforms
    to_tensor = next(i for i, t in enumerate(steps) if "ToTensor" in type(t).__name__)
    crops, tensors = [], []
    for image in calibration.photos(PHOTOS, SEED):
        crop = image
        for step in steps[:to_tensor]:
            crop = step(crop)
        crops.append(np.asarray(crop.convert("RGB"), dtype=np.uint8))
        tensors.append(transform(image))
    pixels = np.stack(crops)
    with torch.no_grad():
        reference = loaded.clip.encode_image(torch.stack(tensors)).numpy()  # type: ignore[operator]
    exact = session(fp32).run(None, {INPUT_NAME: pixels})[0]
    quantized = session(int8)
    got = quantized.run(None, {INPUT_NAME: pixels})[0]
    canary = quantized.run(None, {INPUT_NAME: canary_pixels(loaded.image_size)})[0][0]
    return {
        "set": f"{PHOTOS} generated photos (clip_gateway/model/calibration.py), open_clip's resize"
        " and crop",
        "vs_fp32": gate.stats(gate.cosine(got, exact)),
        "vs_open_clip": gate.stats(gate.cosine(got, reference)),
        "fp32_vs_open_clip": gate.stats(gate.cosine(exact, reference)),
    }, encode_reference(canary)


def _text_figures(
    loaded: LoadedModel, manifest: dict[str, Any], directory: Path, int8: Path
) -> tuple[dict[str, Any], str]:
    from clip_gateway.export.tokenizer import reference_tokenizer, served_tokenizer

    texts = calibration.texts(TEXTS, SEED)
    ours = served_tokenizer(directory, manifest["tokenizer"])
    tokens = ours.tokenize(texts)
    # open_clip's own pipeline: its tokenizer and encode_text
    theirs = reference_tokenizer(directory, manifest)(texts)
    with torch.no_grad():
        reference = loaded.clip.encode_text(theirs).numpy()  # type: ignore[operator]
    exact = session(directory / TEXT_FP32_FILE).run(None, {TEXT_INPUT_NAME: tokens})[0]
    quantized = session(int8)
    got = quantized.run(None, {TEXT_INPUT_NAME: tokens})[0]
    canary = quantized.run(None, {TEXT_INPUT_NAME: ours.tokenize([TEXT_CANARY])})[0][0]
    return {
        "set": f"{TEXTS} generated captions (clip_gateway/model/calibration.py), 1/8 past the"
        " context length",
        "vs_fp32": gate.stats(gate.cosine(got, exact)),
        "vs_open_clip": gate.stats(gate.cosine(got, reference)),
        "fp32_vs_open_clip": gate.stats(gate.cosine(exact, reference)),
    }, encode_reference(canary)
