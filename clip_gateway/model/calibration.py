"""The INT8 gate's calibration set, generated (licence-clean, nothing downloaded): photo-like
images and captions, deterministic for a seed.

Random pixels or ids would flatter a quantized graph: it is real images' smooth regions, edges
and texture, and real sentences' token statistics, that push activations to the ranges INT8 must
cover. ``photo`` (smooth lighting, objects with hard edges, texture and sensor noise) is the one
generator of synthetic photos: the benches draw theirs from it too (bench/harness/photos.py).
The set is drawn at the sizes a client uploads; the captions are built from a small vocabulary in
the shapes CLIP is queried with, plus lengths around the context limit.
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

#: Upload-sized photos (width, height): landscape, portrait and square, around 256 px short side.
PHOTO_SIZES = ((341, 256), (256, 341), (300, 300), (400, 260), (512, 384))

_SUBJECTS = (
    "cat", "dog", "red car", "bicycle", "mountain", "beach", "city street", "bowl of soup",
    "wedding", "birthday cake", "old man", "child", "forest", "train", "sailboat", "garden",
    "laptop", "guitar", "horse", "bridge", "sunset", "snowy field", "kitchen", "library",
)  # fmt: skip
_PLACES = (
    "in the rain", "at night", "on a sunny day", "in a museum", "by the sea", "in the snow",
    "on a wooden table", "in a crowded market", "under a blue sky", "next to a window",
)  # fmt: skip
_STYLES = (
    "a photo of a {}", "a blurry photo of a {}", "a close-up of a {}", "a painting of a {}",
    "a black and white photo of a {}", "an illustration of a {}", "a screenshot showing a {}",
    "{}", "the {} I saw yesterday", "a diagram of a {}",
)  # fmt: skip


def photos(count: int, seed: int = 0) -> list[Image.Image]:
    """``count`` RGB photo-like images of upload sizes, deterministic for ``seed``."""
    rng = np.random.default_rng(seed)
    return [
        photo(*PHOTO_SIZES[i % len(PHOTO_SIZES)], int(rng.integers(1 << 31))) for i in range(count)
    ]


def photo(width: int, height: int, seed: int = 0) -> Image.Image:
    """An RGB image of ``width`` x ``height`` with photo-like statistics, deterministic for
    ``seed``. Random pixels compress to nothing like a photo and flat images far too well; these
    land where camera JPEGs do (roughly 0.2-0.5 bytes/pixel at q90). A change to it changes the
    calibration set (tests/unit/model/test_calibration.py pins its digest)."""
    rng = np.random.default_rng(seed)
    # low-frequency lighting: a tiny random image blown up smoothly
    small = rng.integers(30, 226, size=(4, 6, 3), dtype=np.uint8)
    base = Image.fromarray(small).resize((width, height), Image.Resampling.BICUBIC)
    draw = ImageDraw.Draw(base)
    scale = min(width, height)
    for _ in range(12):  # objects: hard edges at several scales
        x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
        w, h = (int(v) for v in rng.integers(scale // 20, scale // 3, size=2))
        colour = tuple(int(c) for c in rng.integers(0, 256, size=3))
        shape = draw.ellipse if rng.random() < 0.5 else draw.rectangle
        shape((x0, y0, x0 + w, y0 + h), fill=colour)
    # the blur grows with camera-sized images (1 px at the calibration set's sizes)
    base = base.filter(ImageFilter.GaussianBlur(radius=max(1.0, scale / 1500)))
    pixels = np.asarray(base, dtype=np.int16)
    # texture + sensor noise
    noise = rng.normal(0, 9, size=(height // 2 + 1, width // 2 + 1, 1))
    texture = np.repeat(np.repeat(noise, 2, axis=0), 2, axis=1)[:height, :width]
    grain = rng.normal(0, 3.5, size=(height, width, 1))
    return Image.fromarray(np.clip(pixels + texture + grain, 0, 255).astype(np.uint8), "RGB")


def texts(count: int, seed: int = 0) -> list[str]:
    """``count`` captions: CLIP-style prompts, a few long ones past the context length, and the
    odd one out (numbers, punctuation, a single word)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        subject = _SUBJECTS[int(rng.integers(len(_SUBJECTS)))]
        caption = _STYLES[int(rng.integers(len(_STYLES)))].format(subject)
        if rng.random() < 0.5:
            caption += " " + _PLACES[int(rng.integers(len(_PLACES)))]
        if i % 8 == 7:  # long: around and past 77 tokens
            caption = ", ".join([caption] * int(rng.integers(4, 12)))
        elif i % 8 == 3:
            caption = f"{caption.upper()}!!! #{int(rng.integers(1000))} (2024)"
        out.append(caption)
    return out
