"""The exportable encoder: uint8 NHWC pixels in, open_clip's normalisation inside, embedding out."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import open_clip
import torch
from torch import nn

from clip_gateway.model.spec import (
    DEFAULT_MODEL,
    DEFAULT_PRETRAINED,
    Weights,
    WeightsUnavailableError,
)

log = logging.getLogger(__name__)


class PixelEncoder(nn.Module):
    """open_clip's visual tower behind its own preprocessing, taking the wire format directly.

    ``pixels`` is uint8 ``[batch, H, W, 3]`` RGB, already resized and centre-cropped. The cast, the
    ``/255``, CLIP's mean/std normalisation and the NHWC→NCHW transpose are folded into one
    multiply-add here, so they run inside the graph on the accelerator and the wire carries a
    quarter of the bytes an FP32 tensor would.
    """

    def __init__(self, visual: nn.Module, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
        super().__init__()
        self.visual = visual
        mean_t = torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1)
        std_t = torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1)
        # (x/255 - mean)/std == x * (1/(255*std)) - mean/std
        self.register_buffer("scale", 1.0 / (255.0 * std_t))
        self.register_buffer("shift", mean_t / std_t)

    scale: torch.Tensor
    shift: torch.Tensor

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        # Cast first, then permute: TensorRT takes uint8 only as a network input feeding a Cast
        # (onnx-tensorrt rejects any other uint8 tensor), so a Transpose on uint8 would fall off
        # the TensorRT subgraph and leave it with a dynamic input it has no profile for.
        x = pixels.to(torch.float32).permute(0, 3, 1, 2)
        x = x * self.scale - self.shift
        return self.visual(x)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class LoadedModel:
    clip: nn.Module
    encoder: PixelEncoder
    image_size: int
    embed_dim: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    interpolation: str
    #: The model's whole ``visual.preprocess_cfg`` (clip_gateway/export/preprocessing.py reads it).
    preprocess_cfg: dict[str, Any]
    #: The pretrained tag whose preprocessing it carries (None: open_clip's defaults).
    preprocess_tag: str | None


def load(model_name: str, weights: Weights) -> LoadedModel:
    """Create the open_clip model with the requested weights; never silently random."""
    tag = weights.value if weights.kind == "pretrained" else default_tag(model_name)
    # random weights and checkpoints carry the preprocessing of the default tag: what users of
    # that tag run (open_clip applies a tag's configuration only when it downloads the tag)
    preprocess = tag_preprocess_cfg(model_name, tag) if weights.kind != "pretrained" else None
    if weights.kind == "random":
        torch.manual_seed(int(weights.value))
        clip = open_clip.create_model(model_name, pretrained=None, force_preprocess_cfg=preprocess)
    elif weights.kind == "checkpoint":
        try:
            clip = open_clip.create_model(
                model_name, pretrained=weights.value, force_preprocess_cfg=preprocess
            )
        except Exception as exc:  # unreadable file, wrong architecture, truncated download...
            raise WeightsUnavailableError(
                f"cannot load checkpoint {weights.value} into {model_name}: {exc}"
            ) from exc
    else:
        clip = _create_pretrained(model_name, weights.value)
    clip.eval()
    cfg = clip.visual.preprocess_cfg
    size = cfg["size"]
    image_size = int(size[0] if isinstance(size, tuple | list) else size)
    encoder = PixelEncoder(clip.visual, tuple(cfg["mean"]), tuple(cfg["std"])).eval()
    with torch.no_grad():
        embed_dim = int(
            encoder(torch.zeros(1, image_size, image_size, 3, dtype=torch.uint8)).shape[-1]
        )
    return LoadedModel(
        clip=clip,
        encoder=encoder,
        image_size=image_size,
        embed_dim=embed_dim,
        mean=tuple(cfg["mean"]),
        std=tuple(cfg["std"]),
        interpolation=str(cfg.get("interpolation", "bicubic")),
        preprocess_cfg=dict(cfg),
        preprocess_tag=tag,
    )


def default_tag(model_name: str) -> str | None:
    """The pretrained tag ``make serve`` uses for ViT-B-32, else open_clip's first for the model."""
    if model_name == DEFAULT_MODEL:
        return DEFAULT_PRETRAINED
    tags: list[str] = open_clip.list_pretrained_tags_by_model(model_name)
    return tags[0] if tags else None


def tag_preprocess_cfg(model_name: str, tag: str | None) -> dict[str, Any] | None:
    """The preprocessing keys a pretrained tag's configuration sets (None: no tag)."""
    if tag is None:
        return None
    from open_clip.transform import merge_preprocess_dict

    merged: dict[str, Any] = merge_preprocess_dict(
        {}, open_clip.get_pretrained_cfg(model_name, tag)
    )
    return merged or None


def _create_pretrained(model_name: str, tag: str) -> nn.Module:
    known = open_clip.list_pretrained_tags_by_model(model_name)
    if tag not in known:
        raise WeightsUnavailableError(
            f"open_clip has no pretrained tag {tag!r} for {model_name}; "
            f"known tags: {', '.join(known)}"
        )
    try:
        model: nn.Module = open_clip.create_model(model_name, pretrained=tag)
        return model
    except Exception as exc:  # hub/network errors come in many types; all mean the same here
        raise WeightsUnavailableError(
            f"could not fetch pretrained weights {tag!r} for {model_name}: {exc}\n"
            "Either point at a local checkpoint file (make serve CLIP_WEIGHTS=/path/to.bin, "
            "clip-gateway serve --weights /path/to.bin, python -m clip_gateway.export "
            "--checkpoint PATH), or "
            "use random weights explicitly for tests and benchmarks (CLIP_WEIGHTS=random, "
            "--weights random, --random-init)."
        ) from exc
