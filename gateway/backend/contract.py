"""The contract shared by the exported ONNX graph, the Triton configs and the gateway: tensor
names and types, and the canary image whose export-time embedding the config carries."""

import base64
from typing import Final

import numpy as np

#: Name of the model inside Triton's model repository (same for every profile).
TRITON_MODEL_NAME: Final = "clip_image"
#: uint8 NHWC RGB, already resized and centre-cropped; normalisation happens inside the graph.
INPUT_NAME: Final = "pixels"
#: float32 image embedding, *not* L2-normalised (the gateway normalises unless asked not to).
OUTPUT_NAME: Final = "embedding"

#: Model-config parameter holding the canary image's export-time embedding (base64 float32 LE).
CANARY_PARAMETER: Final = "canary_embedding"


def canary_pixels(size: int) -> np.ndarray:
    """uint8 ``[1, size, size, 3]``: smooth colour fields and hard edges, closed-form (no RNG)."""
    y, x = np.mgrid[0:size, 0:size].astype(np.float64) / size
    red = 0.5 + 0.5 * np.sin(6.0 * x + 2.0 * y)
    green = 0.5 + 0.5 * np.cos(4.0 * y - 3.0 * x * y)
    blue = ((x - 0.5) ** 2 + (y - 0.4) ** 2 < 0.08).astype(np.float64) * 0.8 + 0.1 * x
    image = np.stack([red, green, blue], axis=-1)
    image[(x > 0.7) & (y > 0.6)] = (0.9, 0.8, 0.1)
    return (image * 255).round().astype(np.uint8)[None]


def encode_reference(embedding: np.ndarray) -> str:
    return base64.b64encode(np.asarray(embedding, dtype="<f4").tobytes()).decode()


def decode_reference(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype="<f4")
