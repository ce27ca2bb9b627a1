"""Gateway embeddings vs open_clip's own reference pipeline (PIL + its transforms + torch model).

Over camera-sized photos (8-24 MP, baseline and progressive, EXIF-rotated), compact JPEGs, PNG
and WebP. The gateway decodes at 1/8 scale in the DCT domain and skips progressive AC scans; the
reference decodes every pixel. Acceptance: cosine >= 0.995 mean, >= 0.99 minimum.
"""

from __future__ import annotations

import io

import httpx
import numpy as np
import open_clip
import pytest
import torch
from PIL import Image, ImageOps

from bench.photos import CAMERA_SIZES, jpeg, photo
from export.model import Weights, load
from tests import samples


def photo_set() -> list[tuple[str, bytes]]:
    out: list[tuple[str, bytes]] = []
    for i, mp in enumerate((8, 12, 16, 24)):
        image = photo(*CAMERA_SIZES[mp], seed=900 + i)
        out.append((f"{mp}mp-baseline", jpeg(image)))
        out.append((f"{mp}mp-progressive", jpeg(image, progressive=True)))
        out.append((f"{mp}mp-exif6", jpeg(image, orientation=6)))
    out += [(f"compact-{i}", samples.compact(100 + i)) for i in range(6)]
    out += [("png", samples.png(7)), ("webp", samples.webp(8)), ("gray", samples.grayscale_jpeg(9))]
    return out


@pytest.fixture(scope="module")
def reference_model():
    loaded = load("ViT-B-32", Weights.random(0))  # the weights the session's Triton serves
    _, _, transform = open_clip.create_model_and_transforms("ViT-B-32", pretrained=None)
    return loaded.clip, transform


def reference(model_and_transform, data: bytes) -> np.ndarray:
    model, transform = model_and_transform
    image = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")
    with torch.no_grad():
        vector = model.encode_image(transform(image)[None]).numpy()[0]
    return vector / np.linalg.norm(vector)


def test_fidelity_against_open_clip(gateway, reference_model) -> None:
    cosines = {}
    with httpx.Client(base_url=gateway.url, timeout=300) as http:
        for name, data in photo_set():
            response = http.post("/v1/embeddings", files=[("image", (name, data, "image/jpeg"))])
            assert response.status_code == 200, (name, response.text[:300])
            got = np.array(response.json()["data"][0]["embedding"], dtype=np.float64)
            cosines[name] = float(got @ reference(reference_model, data))
    values = np.array(list(cosines.values()))
    print("\nfidelity (cosine vs open_clip reference):")
    for name, value in cosines.items():
        print(f"  {name:18s} {value:.6f}")
    print(
        f"  n={len(values)} mean={values.mean():.6f} min={values.min():.6f} "
        f"p5={np.percentile(values, 5):.6f} median={np.median(values):.6f}"
    )
    assert values.mean() >= 0.995
    assert values.min() >= 0.99
