"""Expected embeddings from open_clip's own pipeline, never from the code under test.

The model is open_clip's ``create_model_and_transforms(name, pretrained=None)`` right after
``torch.manual_seed(seed)``: exactly the weights ``CLIP_WEIGHTS=random`` (seed 0) stands for,
built here without the exporter, with the image preprocessing of the model's first pretrained tag
(what its users run; open_clip applies a tag's only when it downloads it). Images go through PIL
(full decode, ``ImageOps.exif_transpose``) and open_clip's own transform (resize, centre crop,
ToTensor, Normalize); texts through ``open_clip.get_tokenizer`` and ``encode_text``. The ``perturb``
options are the negative controls: bugs the gateway could have, applied to the reference side
(cos(g, r_bug) equals cos(g_bug, r) when g tracks r), which the fidelity limits must catch.
"""

from __future__ import annotations

import io
from functools import lru_cache
from typing import Any, Literal

import numpy as np
import open_clip
import torch
from PIL import Image, ImageOps

Perturbation = Literal[
    "none", "channel-swap", "no-rotation", "imagenet-mean-std", "shortest-crop", "squash"
]
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@lru_cache(maxsize=2)  # a SigLIP2 model holds ~1.5 GB: a run's dozen models, kept, would not fit
def model(name: str = "ViT-B-32", seed: int = 0) -> tuple[Any, Any]:
    tags = open_clip.list_pretrained_tags_by_model(name)
    cfg = open_clip.get_pretrained_cfg(name, tags[0]) if tags else {}
    torch.manual_seed(seed)
    clip, _, transform = open_clip.create_model_and_transforms(
        name,
        pretrained=None,
        image_mean=cfg.get("mean"),
        image_std=cfg.get("std"),
        image_interpolation=cfg.get("interpolation"),
        image_resize_mode=cfg.get("resize_mode"),
    )
    return clip.eval(), transform


def unit(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float64)
    return vectors / np.linalg.norm(vectors, axis=-1, keepdims=True)


def embed_image(data: bytes, perturb: Perturbation = "none", name: str = "ViT-B-32") -> np.ndarray:
    """Unit-length float64 embedding of encoded image bytes, open_clip's way."""
    clip, transform = model(name)
    if perturb in ("shortest-crop", "squash"):  # the model's transform, another resize mode
        transform = _with_resize_mode(transform, perturb, name)
    image = Image.open(io.BytesIO(data))
    if perturb != "no-rotation":
        image = ImageOps.exif_transpose(image)
    x = transform(image.convert("RGB"))
    if perturb == "channel-swap":
        x = x[[2, 1, 0]]
    elif perturb == "imagenet-mean-std":
        mean, std = _normalize(transform)
        raw = x * torch.tensor(std)[:, None, None] + torch.tensor(mean)[:, None, None]
        x = (raw - torch.tensor(IMAGENET_MEAN)[:, None, None]) / torch.tensor(IMAGENET_STD)[
            :, None, None
        ]
    with torch.no_grad():
        return unit(clip.encode_image(x[None]).numpy()[0])


def embed_images(
    images: list[bytes], perturb: Perturbation = "none", name: str = "ViT-B-32"
) -> np.ndarray:
    return np.stack([embed_image(data, perturb, name) for data in images])


def _with_resize_mode(transform: Any, perturb: str, name: str) -> Any:
    from open_clip.transform import PreprocessCfg, image_transform_v2

    mean, std = _normalize(transform)
    size = model(name)[0].visual.image_size
    mode = "shortest" if perturb == "shortest-crop" else "squash"
    cfg = PreprocessCfg(size=size, mean=mean, std=std, resize_mode=mode)
    return image_transform_v2(cfg, is_train=False)


def embed_pixels(pixels: np.ndarray, name: str = "ViT-B-32") -> np.ndarray:
    """Raw (not normalised) embeddings of uint8 NHWC pixels already at the model's size:
    ToTensor's /255 and the transform's own Normalize, then ``encode_image``."""
    clip, transform = model(name)
    mean, std = _normalize(transform)
    x = torch.from_numpy(pixels).permute(0, 3, 1, 2).to(torch.float32) / 255.0
    x = (x - torch.tensor(mean)[None, :, None, None]) / torch.tensor(std)[None, :, None, None]
    with torch.no_grad():
        return clip.encode_image(x).numpy()


def tokens(texts: list[str], name: str = "ViT-B-32") -> np.ndarray:
    """open_clip's own tokenizer for the model: int64 ``[n, context_length]``."""
    return open_clip.get_tokenizer(name)(texts).numpy()


def hf_tokenizer(name: str, tokenizer_dir: Any, work: Any) -> Any:
    """open_clip's own ``get_tokenizer`` for a model whose Hugging Face tokenizer files are in
    ``tokenizer_dir`` (no hub here): its ``local-dir:`` schema, on a copy of the directory with
    the model's configuration beside the files, builds what it builds from the hub for ``name``
    (HFTokenizer, the config's context length and ``tokenizer_kwargs``)."""
    import json
    import shutil
    from pathlib import Path

    local = Path(work) / f"{name}-tokenizer"
    shutil.copytree(tokenizer_dir, local, dirs_exist_ok=True)
    config = {"model_cfg": open_clip.get_model_config(name)}
    (local / "open_clip_config.json").write_text(json.dumps(config))
    return open_clip.get_tokenizer(f"local-dir:{local}")


def embed_tokens(ids: np.ndarray, name: str = "ViT-B-32") -> np.ndarray:
    """Raw (not normalised) ``encode_text`` of token ids."""
    clip, _ = model(name)
    with torch.no_grad():
        return clip.encode_text(torch.from_numpy(np.asarray(ids, dtype=np.int64))).numpy()


def _normalize(transform: Any) -> tuple[tuple[float, ...], tuple[float, ...]]:
    (normalize,) = [t for t in transform.transforms if type(t).__name__ == "Normalize"]
    return tuple(normalize.mean), tuple(normalize.std)


def cosines(got: np.ndarray, expected: np.ndarray) -> np.ndarray:
    return (unit(got) * unit(expected)).sum(axis=-1)
