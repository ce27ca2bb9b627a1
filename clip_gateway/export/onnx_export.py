"""Write the PixelEncoder and the TokenEncoder as ONNX (dynamic batch axis) and derive the FP16
variants for GPUs."""

from __future__ import annotations

from pathlib import Path

import onnx
import torch

from clip_gateway.export.graph import uint8_only_into_cast
from clip_gateway.export.model import PixelEncoder
from clip_gateway.export.text import TokenEncoder
from clip_gateway.model.contract import (
    INPUT_NAME,
    OUTPUT_NAME,
    TEXT_INPUT_DTYPE,
    TEXT_INPUT_NAME,
    TEXT_OUTPUT_NAME,
)

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
    # TensorRT takes the uint8 input only into a Cast (clip_gateway/export/graph.py)
    model = uint8_only_into_cast(onnx.load(str(path)))
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return model


def export_text_fp32(encoder: TokenEncoder, context_length: int, path: Path) -> onnx.ModelProto:
    example = torch.zeros(2, context_length, dtype=getattr(torch, TEXT_INPUT_DTYPE.name))
    batch = torch.export.Dim("batch", min=1, max=MAX_EXPORT_BATCH)
    # The exporter names aten.embedding's result "embedding" too, so the output gets a
    # placeholder name here and its contract name once that value is renamed.
    placeholder = "__text_output__"
    torch.onnx.export(
        encoder,
        (example,),
        str(path),
        input_names=[TEXT_INPUT_NAME],
        output_names=[placeholder],
        dynamic_shapes={"tokens": {0: batch}},
        opset_version=OPSET,
        dynamo=True,
        external_data=False,
    )
    model = onnx.load(str(path))
    _rename_value(model.graph, TEXT_OUTPUT_NAME, "token_embedding_output")
    _rename_value(model.graph, placeholder, TEXT_OUTPUT_NAME)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return model


def _rename_value(graph: onnx.GraphProto, old: str, new: str) -> None:
    """Rename a value everywhere it appears: producers, consumers, graph outputs, value infos."""
    for node in graph.node:
        node.input[:] = [new if name == old else name for name in node.input]
        node.output[:] = [new if name == old else name for name in node.output]
    for info in (*graph.output, *graph.value_info):
        if info.name == old:
            info.name = new


def convert_fp16(fp32: onnx.ModelProto, path: Path) -> onnx.ModelProto:
    """FP16 weights and activations for the ``cuda`` profile; the uint8 (int32) input and FP32
    output stay as they are.

    Keeping the I/O types means every profile has the same tensor contract, so the gateway never
    learns which precision it is talking to. Before the conversion, ONNX Runtime's transformer
    fusions (``model_type="clip"``: SkipLayerNormalization, BiasGelu / QuickGelu) replace the
    exporter's elementwise chains with single CUDA kernels: measured on an H100 with the CUDA EP,
    1.34x images/s for ViT-B-32 and 1.46x for ViT-B-16 at batch 128, cosine vs FP32 0.999999
    (bench/results/gpu). ``opt_level=0`` applies only those pattern fusions, no provider-specific
    rewrite, so the graph still runs on the CPU EP (the parity check) and any CUDA EP. The fused
    ops are ONNX Runtime contrib ops, which TensorRT's parser does not take: the ``tensorrt``
    profile reads the FP32 graph and builds its own FP16 engine from it.
    """
    from onnxruntime.transformers.optimizer import optimize_model

    fused = optimize_model(fp32, model_type="clip", opt_level=0, use_gpu=True)
    fused.convert_float_to_float16(keep_io_types=True)
    # saving is also what adds the com.microsoft opset import the fused nodes need
    fused.save_model_to_file(str(path))
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    return model


def fused_ops(model: onnx.ModelProto) -> dict[str, int]:
    """How many of ONNX Runtime's contrib ops the FP16 graph holds, by type (the manifest
    records them so a fusion that stops matching after an exporter upgrade shows)."""
    counts: dict[str, int] = {}
    for node in model.graph.node:
        if node.domain == "com.microsoft":
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return dict(sorted(counts.items()))
