"""The image preprocessing a model was trained with, as the gateway must reproduce it, or a refusal.

Read from the model's own ``visual.preprocess_cfg`` (open_clip's ``PreprocessCfg``: size, mean, std,
interpolation, resize mode, fill colour), which the exporter fills from the pretrained tag's
configuration (clip_gateway/export/model.py). The gateway reproduces open_clip's inference
transform for:

- ``shortest``: resize the shorter side to the size, centre crop (torchvision ``Resize`` +
  ``CenterCrop``);
- ``longest``: resize the longer side to the size, centre pad with ``fill_color``
  (``ResizeKeepRatio(longest=1)`` + ``CenterCropOrPad``);
- ``squash``: resize both sides to the size, aspect ratio not kept, no crop;

with bicubic or bilinear interpolation, a square size and per-channel mean/std. Anything else is
refused here, at export, rather than served approximately.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from clip_gateway.model.spec import UnsupportedModelError

RESIZE_MODES = ("shortest", "longest", "squash")
INTERPOLATIONS = ("bicubic", "bilinear")


def image_preprocessing(model_name: str, cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest's ``preprocess`` entry for ``cfg`` (a ``visual.preprocess_cfg``)."""
    problems = []
    size = cfg.get("size", 224)
    height, width = (size, size) if isinstance(size, int) else tuple(size)
    if height != width:
        problems.append(f"a non-square input size {height}x{width}")
    if cfg.get("mode", "RGB") != "RGB":
        problems.append(f"colour mode {cfg.get('mode')!r}")
    interpolation = cfg.get("interpolation", "bicubic")
    if interpolation not in INTERPOLATIONS:
        problems.append(f"interpolation {interpolation!r}")
    resize_mode = cfg.get("resize_mode", "shortest")
    if resize_mode not in RESIZE_MODES:
        problems.append(f"resize mode {resize_mode!r}")
    mean, std = list(cfg.get("mean", ())), list(cfg.get("std", ()))
    if len(mean) != 3 or len(std) != 3 or min(std, default=0) <= 0:
        problems.append(f"mean {mean} / std {std} (three channels, positive std expected)")
    fill = _fill_color(cfg.get("fill_color", 0)) if resize_mode == "longest" else None
    if resize_mode == "longest" and fill is None:
        problems.append(f"fill colour {cfg.get('fill_color')!r}")
    if problems:
        raise UnsupportedModelError(
            f"{model_name}: the gateway cannot reproduce this model's image preprocessing "
            f"({'; '.join(problems)}). It reproduces a square size, resize "
            f"{'/'.join(RESIZE_MODES)} with {'/'.join(INTERPOLATIONS)} interpolation, the "
            "centre crop (or pad) that follows, and per-channel mean/std; refusing to export "
            "rather than serve it approximately."
        )
    return {
        "size": int(height),
        "mean": [float(m) for m in mean],
        "std": [float(s) for s in std],
        "interpolation": interpolation,
        "resize_mode": resize_mode,
        # shortest: the resized image is cropped to the size; longest: it is padded to it
        # (with fill_color); squash: it already is the size
        "center_crop": resize_mode != "squash",
        "fill_color": fill,
    }


def _fill_color(value: Any) -> list[int] | None:
    """An RGB triple of 0..255 from open_clip's int or sequence form; None if neither."""
    if not isinstance(value, int | list | tuple):
        return None
    channels = [value] * 3 if isinstance(value, int) else list(value)
    if len(channels) != 3 or not all(isinstance(c, int) and 0 <= c <= 255 for c in channels):
        return None
    return channels
