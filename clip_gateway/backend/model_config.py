"""The model repository's configs as Triton reports them (``config.pbtxt`` as JSON), checked
against the model contract and read into the backend seam's ``ModelInfo``: no gRPC here, so a
backend that reads the same repository another way needs nothing of the Triton client."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from clip_gateway.backend.protocol import ModelInfo, ModelPreprocessing, TextModel
from clip_gateway.errors import BackendFailed
from clip_gateway.model.contract import (
    CANARY_PARAMETER,
    CLIP_BPE,
    CONTEXT_LENGTH_PARAMETER,
    HF_TOKENIZER,
    INPUT_NAME,
    OUTPUT_NAME,
    PREPROCESS_PARAMETER,
    QUANTIZATION_PARAMETER,
    TEXT_INPUT_NAME,
    TEXT_OUTPUT_NAME,
    TEXT_UNAVAILABLE_PARAMETER,
    TOKENIZER_FILE_PARAMETER,
    TOKENIZER_OPTIONS_PARAMETER,
    TOKENIZER_PARAMETER,
    decode_reference,
)


def parse_model_config(config: dict[str, Any]) -> ModelInfo:
    """Check Triton's view of the model against our contract and extract its sizes."""
    inputs = {t["name"]: t for t in config.get("input", [])}
    outputs = {t["name"]: t for t in config.get("output", [])}
    if INPUT_NAME not in inputs or OUTPUT_NAME not in outputs:
        raise BackendFailed(
            f"model {config.get('name')!r} lacks input {INPUT_NAME!r} or output {OUTPUT_NAME!r}"
        )
    pixels, embedding = inputs[INPUT_NAME], outputs[OUTPUT_NAME]
    dims = [int(d) for d in pixels.get("dims", [])]
    if pixels.get("data_type") != "TYPE_UINT8" or len(dims) != 3 or dims[0] != dims[1]:
        raise BackendFailed(f"unexpected input {pixels}: want TYPE_UINT8 [S, S, 3]")
    if embedding.get("data_type") != "TYPE_FP32":
        raise BackendFailed(f"unexpected output {embedding}: want TYPE_FP32 [D]")
    parameters = _parameters(config)
    canary = parameters.get(CANARY_PARAMETER)
    preprocessing = None
    if PREPROCESS_PARAMETER in parameters:
        preprocessing = parse_preprocessing(parameters[PREPROCESS_PARAMETER], dims[0])
    return ModelInfo(
        name=str(config.get("name")),
        image_size=dims[0],
        embed_dim=int(embedding["dims"][-1]),
        max_batch_size=max(1, int(config.get("max_batch_size", 1))),
        canary=decode_reference(canary) if canary else None,
        preprocessing=preprocessing,
        text_unavailable=parameters.get(TEXT_UNAVAILABLE_PARAMETER),
        quantization=_quantization(parameters, "image", None),
        instances=_instances(config),
    )


def _instances(config: dict[str, Any]) -> int:
    """Model instances the config runs side by side (its instance groups' counts)."""
    groups = config.get("instance_group") or []
    return max(1, sum(int(group.get("count", 1)) for group in groups)) if groups else 1


def _quantization(
    parameters: dict[str, str], tower: str, known: dict[str, Any] | None
) -> dict[str, Any] | None:
    """``known`` with this tower's quantization parameter (JSON) added, when it has one."""
    if QUANTIZATION_PARAMETER not in parameters:
        return known
    try:
        value = json.loads(parameters[QUANTIZATION_PARAMETER])
    except ValueError as exc:
        raise BackendFailed(f"unreadable quantization parameter of the {tower} model") from exc
    return (known or {}) | {tower: value}


def _parameters(config: dict[str, Any]) -> dict[str, str]:
    return {k: str(v.get("string_value", "")) for k, v in config.get("parameters", {}).items()}


def parse_preprocessing(text: str, image_size: int) -> ModelPreprocessing:
    """The ``preprocess`` parameter (the manifest's, as JSON), checked: a model whose
    preprocessing the gateway would reproduce only approximately is refused, never served."""
    try:
        spec = json.loads(text)
        fill, mean, std = (
            tuple(spec.get(key) or (0, 0, 0)) for key in ("fill_color", "mean", "std")
        )
        if not len(fill) == len(mean) == len(std) == 3:
            raise ValueError("fill_color, mean and std need three channels")
        preprocessing = ModelPreprocessing(
            size=int(spec["size"]),
            resize_mode=spec["resize_mode"],
            interpolation=spec["interpolation"],
            fill_color=(int(fill[0]), int(fill[1]), int(fill[2])),
            mean=(float(mean[0]), float(mean[1]), float(mean[2])),
            std=(float(std[0]), float(std[1]), float(std[2])),
            from_tag=spec.get("from_tag"),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise BackendFailed(f"unreadable preprocess parameter {text!r}: {exc}") from exc
    problems = []
    if preprocessing.size != image_size:
        problems.append(f"size {preprocessing.size} but the model takes {image_size}")
    if preprocessing.resize_mode not in ("shortest", "longest", "squash"):
        problems.append(f"resize mode {preprocessing.resize_mode!r}")
    if preprocessing.interpolation not in ("bicubic", "bilinear"):
        problems.append(f"interpolation {preprocessing.interpolation!r}")
    if problems:
        raise BackendFailed(f"this gateway cannot reproduce the model's preprocessing: {problems}")
    return preprocessing


def parse_text_config(info: ModelInfo, config: dict[str, Any]) -> ModelInfo:
    """``info`` with the text model from its config, or with why texts cannot be served."""
    parameters = _parameters(config)
    inputs = {t["name"]: t for t in config.get("input", [])}
    outputs = {t["name"]: t for t in config.get("output", [])}
    name = str(config.get("name"))
    tokens, embedding = inputs.get(TEXT_INPUT_NAME), outputs.get(TEXT_OUTPUT_NAME)
    if tokens is None or embedding is None or tokens.get("data_type") != "TYPE_INT32":
        raise BackendFailed(f"text model {name!r} does not take int32 {TEXT_INPUT_NAME!r}")
    if int(embedding["dims"][-1]) != info.embed_dim:
        raise BackendFailed(
            f"text model {name!r} embeds into {embedding['dims'][-1]} dimensions, the image "
            f"model into {info.embed_dim}: not one space"
        )
    kind = parameters.get(TOKENIZER_PARAMETER)
    if kind not in (CLIP_BPE, HF_TOKENIZER):
        reason = parameters.get(TEXT_UNAVAILABLE_PARAMETER) or f"tokenizer {kind!r} is not served"
        return dataclasses.replace(info, text_unavailable=reason)
    options = json.loads(parameters.get(TOKENIZER_OPTIONS_PARAMETER) or "{}")
    strip_sep_id = options.get("strip_sep_id")
    context = int(parameters.get(CONTEXT_LENGTH_PARAMETER) or tokens["dims"][-1])
    canary = parameters.get(CANARY_PARAMETER)
    text = TextModel(
        name=name,
        context_length=context,
        max_batch_size=max(1, int(config.get("max_batch_size", 1))),
        tokenizer_file=parameters[TOKENIZER_FILE_PARAMETER],
        tokenizer_kind=kind,
        clean=str(options.get("clean") or ("lower" if kind == CLIP_BPE else "whitespace")),
        strip_sep_id=None if strip_sep_id is None else int(strip_sep_id),
        pooling=options.get("pooling"),
        canary=decode_reference(canary) if canary else None,
        instances=_instances(config),
    )
    quantization = _quantization(parameters, "text", info.quantization)
    return dataclasses.replace(info, text=text, quantization=quantization)
