"""INT8 variants of an exported FP32 graph with ONNX Runtime's own quantization tools.

Two methods, both restricted to the weight matrix multiplications (``MatMul`` with a constant
B, and the attention's ``Gemm`` output projection, which ORT rewrites to MatMul + Add): they
hold ~all of the compute, and quantizing anything else buys little and costs accuracy.

- ``dynamic`` (``quantize_dynamic``): int8 weights, per output channel; activations quantized at
  run time per tensor, so no calibration and no range to get wrong. ORT fuses each into one
  ``DynamicQuantizeMatMul`` kernel.
- ``static`` (``quantize_static``, QDQ format): activations' ranges calibrated on data (a
  ``CalibrationDataReader`` over the calibration set), QuantizeLinear/DequantizeLinear pairs
  around each quantized MatMul.

What never changes is the contract: the same input (uint8 pixels / int32 token ids, same name
and shape) feeding the same Cast, the same FP32 output. The quantizer is asked only for MatMuls,
so the input Cast and the normalisation after it stay FP32, and ``check_contract`` verifies it.
The quantization study measured both on this machine (a concluded study:
``git checkout c84860a && python -m bench quantization``); docs/PROFILES.md
"The cpu-int8 profile" has the figures and why ``dynamic`` won.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import onnx
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)

Method = Literal["dynamic", "static"]
#: What ``python -m clip_gateway.export --int8`` writes (the measured winner, docs/PROFILES.md
#: "The cpu-int8 profile").
DEFAULT_METHOD: Method = "dynamic"
#: Ops asked of the quantizer; Gemm comes along (ORT's dynamic mode turns it into MatMul).
DYNAMIC_OPS = ("MatMul",)
STATIC_OPS = ("MatMul", "Gemm")


def quantize(
    method: Method,
    fp32: Path,
    out: Path,
    *,
    per_channel: bool = True,
    calibration: Sequence[dict[str, np.ndarray]] = (),
) -> onnx.ModelProto:
    """Write the INT8 variant of ``fp32`` to ``out`` and return it, contract checked."""
    # ORT logs "consider pre-processing" at WARNING for every call: its shape-inference step
    # does nothing for these fully shaped graphs
    quiet = logging.getLogger()
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        if method == "dynamic":
            quantize_dynamic(
                fp32, out, op_types_to_quantize=list(DYNAMIC_OPS), per_channel=per_channel,
                weight_type=QuantType.QInt8, extra_options={"MatMulConstBOnly": True},
            )  # fmt: skip
        else:
            if not calibration:
                raise ValueError("static quantization needs calibration batches")
            quantize_static(
                fp32, out, _Reader(calibration), quant_format=QuantFormat.QDQ,
                op_types_to_quantize=list(STATIC_OPS), per_channel=per_channel,
                activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                calibrate_method=CalibrationMethod.MinMax,
                nodes_to_exclude=_activation_matmuls(fp32),
                extra_options={"MatMulConstBOnly": True},
            )  # fmt: skip
    finally:
        quiet.setLevel(level)
    model = onnx.load(str(out))
    check_contract(onnx.load(str(fp32), load_external_data=False), model)
    return model


def _activation_matmuls(fp32: Path) -> list[str]:
    """MatMuls of two activations (attention's QK^T and AV): left in FP32."""
    graph = onnx.load(str(fp32), load_external_data=False).graph
    weights = {i.name for i in graph.initializer}
    return [n.name for n in graph.node if n.op_type == "MatMul" and n.input[1] not in weights]


class _Reader(CalibrationDataReader):  # type: ignore[misc]
    def __init__(self, batches: Sequence[dict[str, np.ndarray]]) -> None:
        self._batches: Iterator[dict[str, np.ndarray]] = iter(batches)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._batches, None)


def _signature(tensors: Sequence[onnx.ValueInfoProto]) -> list[tuple[str, int, list[str]]]:
    return [
        (
            t.name,
            t.type.tensor_type.elem_type,
            [d.dim_param or str(d.dim_value) for d in t.type.tensor_type.shape.dim],
        )
        for t in tensors
    ]


def check_contract(fp32: onnx.ModelProto, int8: onnx.ModelProto) -> None:
    """The INT8 graph takes and returns exactly what the FP32 graph does, and its input feeds
    the same ops (the Cast, and for the text tower the Shape beside it), none quantized."""
    if _signature(fp32.graph.input) != _signature(int8.graph.input):
        raise ValueError(f"INT8 graph inputs changed: {_signature(int8.graph.input)}")
    if _signature(fp32.graph.output) != _signature(int8.graph.output):
        raise ValueError(f"INT8 graph outputs changed: {_signature(int8.graph.output)}")
    for name in (t.name for t in fp32.graph.input):
        before = sorted(n.op_type for n in fp32.graph.node if name in n.input)
        after = sorted(n.op_type for n in int8.graph.node if name in n.input)
        if before != after:
            raise ValueError(f"INT8 graph reads {name!r} with {after}, FP32 with {before}")
