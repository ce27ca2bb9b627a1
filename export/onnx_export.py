"""Write the PixelEncoder as ONNX (dynamic batch axis) and derive the FP16 variant for GPUs."""

from __future__ import annotations

from pathlib import Path

import onnx
import torch

from export.graph import uint8_only_into_cast
from export.model import PixelEncoder
from gateway.backend.contract import INPUT_NAME, OUTPUT_NAME

#: ONNX opset written by the exporter. 18 is the torch dynamo exporter's native opset and is
#: supported by the ONNX Runtime in every Triton release since 23.x.
OPSET = 18
#: Upper bound of the symbolic batch dimension recorded by torch.export (Triton enforces its own
#: ``max_batch_size`` on top; this only has to be larger).
MAX_EXPORT_BATCH = 4096


def export_fp32(encoder: PixelEncoder, image_size: int, path: Path) -> onnx.ModelProto:
    example = torch.zeros(2, image_size, image_size, 3, dtype=torch.uint8)
    batch = torch.export.Dim("batch", min=1, max=MAX_EXPORT_BATCH)
    torch.onnx.export(
        encoder,
        (example,),
        str(path),
        input_names=[INPUT_NAME],
        output_names=[OUTPUT_NAME],
        dynamic_shapes={"pixels": {0: batch}},
        opset_version=OPSET,
        dynamo=True,
        external_data=False,
    )
    # TensorRT takes the uint8 input only into a Cast (export/graph.py)
    model = uint8_only_into_cast(onnx.load(str(path)))
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return model


def convert_fp16(fp32: onnx.ModelProto, path: Path) -> onnx.ModelProto:
    """FP16 weights and activations; the uint8 input and FP32 output stay as they are.

    Keeping the I/O types means every profile has the same tensor contract, so the gateway never
    learns which precision it is talking to.
    """
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model: onnx.ModelProto = convert_float_to_float16(fp32, keep_io_types=True)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return model
