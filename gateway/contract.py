"""The tensor contract shared by the exported ONNX graph, the Triton configs and the gateway."""

from typing import Final

#: Name of the model inside Triton's model repository (same for every profile).
TRITON_MODEL_NAME: Final = "clip_image"
#: uint8 NHWC RGB, already resized and centre-cropped; normalisation happens inside the graph.
INPUT_NAME: Final = "pixels"
INPUT_DTYPE: Final = "UINT8"
#: float32 image embedding, *not* L2-normalised (the gateway normalises unless asked not to).
OUTPUT_NAME: Final = "embedding"
OUTPUT_DTYPE: Final = "FP32"
CHANNELS: Final = 3
