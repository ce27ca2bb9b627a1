"""The client suite: run in a virtualenv holding only ``pip install clip-gateway`` (no server
extra), against a real server started by the full install (tests/integration/test_client_install.py
sets CLIP_GATEWAY_URL). Nothing here may import the server, torch or the test helpers above."""

from __future__ import annotations

import io
import os

import numpy as np
import pytest
from PIL import Image


@pytest.fixture(scope="session")
def url() -> str:
    return os.environ["CLIP_GATEWAY_URL"]


def photo(width: int, height: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
    return Image.fromarray(small).resize((width, height), Image.Resampling.BICUBIC)


def jpeg(image: Image.Image, **options: object) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=90, **options)
    return buf.getvalue()


@pytest.fixture
def jpegs() -> list[bytes]:
    return [jpeg(photo(640 + 64 * i, 480, seed=i)) for i in range(5)]
