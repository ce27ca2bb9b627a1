"""The contract shared by the exported ONNX graphs, the Triton configs and the gateway: model and
tensor names and types, the config parameters the gateway reads, and the canary image and text
whose export-time embeddings the configs carry."""

import base64
from typing import Final

import numpy as np

#: Name of the model inside Triton's model repository (same for every profile).
TRITON_MODEL_NAME: Final = "clip_image"
#: uint8 NHWC RGB, already resized and centre-cropped; normalisation happens inside the graph.
INPUT_NAME: Final = "pixels"
#: float32 image embedding, *not* L2-normalised (the gateway normalises unless asked not to).
OUTPUT_NAME: Final = "embedding"

#: ``clip_image`` config parameter: the image preprocessing the gateway must apply, as JSON (the
#: manifest's ``preprocess``: size, mean, std, interpolation, resize_mode, center_crop,
#: fill_color, from_tag; docs/EXPORT.md).
PREPROCESS_PARAMETER: Final = "preprocess"

#: Model-config parameter holding the canary's export-time embedding (base64 float32 LE): the
#: canary image's in ``clip_image``, the canary text's in ``clip_text``.
CANARY_PARAMETER: Final = "canary_embedding"

#: ``clip_image`` and ``clip_text`` config parameter in the ``cpu-int8`` profile: the tower's
#: precision (``int8``, or ``fp32`` where the operator allowed a fallback and says why), the
#: quantization method and the export's quality-gate figures, as JSON; shown in /v1/models.
QUANTIZATION_PARAMETER: Final = "quantization"
#: In the ``tensorrt`` profile, a model whose graph TensorRT's parser cannot take whole says so
#: (the nodes) here and is served on the CUDA EP (launcher/repository.py).
TENSORRT_BLOCKERS_PARAMETER: Final = "tensorrt_blockers"

#: The text tower's model in Triton, beside ``clip_image`` in every profile.
TEXT_MODEL_NAME: Final = "clip_text"
#: Token ids ``[batch, context_length]``, open_clip's framing (start, text, end, zero padding).
TEXT_INPUT_NAME: Final = "tokens"
#: int32 on the wire (TensorRT's native integer type); the graph casts to int64 itself.
TEXT_INPUT_DTYPE: Final = np.dtype(np.int32)
#: The same tensor name and meaning as the image tower's: float32 ``encode_text`` projection,
#: *not* L2-normalised, in the same space and dimension as the image embedding.
TEXT_OUTPUT_NAME: Final = OUTPUT_NAME

#: ``clip_text`` config parameters (string values): tokens per text (the input's second axis),
CONTEXT_LENGTH_PARAMETER: Final = "context_length"
#: which tokenizer (``clip_bpe``: open_clip's CLIP BPE, see clip_gateway/text/tokenizer.py; ``hf``:
#: open_clip's HFTokenizer, see clip_gateway/text/hf.py; anything else: text cannot be served, the
#: reason parameter says why),
TOKENIZER_PARAMETER: Final = "tokenizer"
#: the absolute path of the tokenizer file (a ``tokenizers`` file the exporter wrote),
TOKENIZER_FILE_PARAMETER: Final = "tokenizer_file"
#: open_clip's framing around it, JSON: ``clean`` (its cleaning function), ``strip_sep_id`` (the
#: id ``strip_sep_token`` zeroes, or null) and ``pooling`` (the graph's, for /v1/models),
TOKENIZER_OPTIONS_PARAMETER: Final = "tokenizer_options"
#: and, when text cannot be served, a sentence saying why (for the 4xx a text request gets).
TEXT_UNAVAILABLE_PARAMETER: Final = "text_unavailable_reason"
#: The tokenizer kinds the gateway reproduces without torch.
CLIP_BPE: Final = "clip_bpe"
HF_TOKENIZER: Final = "hf"

#: A fixed text whose export-time embedding ``clip_text`` carries (CANARY_PARAMETER).
TEXT_CANARY: Final = "a photo of a red circle and a yellow square on a green field"


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
