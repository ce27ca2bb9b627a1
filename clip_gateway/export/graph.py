"""The exported graph as TensorRT sees it (onnx only, no torch): the uint8 input may feed nothing
but a Cast, and every node must be one TensorRT's ONNX parser takes, for the types it has.

ONNX Runtime's TensorRT EP hands TensorRT the largest subgraphs onnx-tensorrt accepts and runs
the rest on the CUDA EP. One rejected node at the start of the graph (a Transpose or Shape on
the uint8 input) makes the TensorRT subgraph's input an intermediate tensor with a dynamic batch
and no optimisation profile, and session creation fails; one rejected node in the middle splits
the graph in two engines with a copy between them. ``tensorrt_blockers`` finds both kinds.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, shape_inference

from clip_gateway.model.contract import INPUT_NAME

#: ONNX ops and element types onnx-tensorrt 10.x supports (its support matrix,
#: https://github.com/onnx/onnx-tensorrt/blob/main/docs/operators.md; TensorRT 10.x ships with the
#: ONNX Runtime of Triton 25.01), for the ops a CLIP vision tower exports to. A new op from a new
#: exporter fails the check until its row is added here from that table. "UINT8 is only supported
#: as network input or output tensor types": of these ops only Cast takes it.
TENSORRT_TYPES: dict[str, frozenset[str]] = {
    op: frozenset(types.split())
    for op, types in {
        "Add": "FP32 FP16 BF16 INT32 INT64",
        "Cast": "FP32 FP16 BF16 INT32 INT64 UINT8 BOOL",
        "Concat": "FP32 FP16 BF16 INT32 INT64 BOOL",
        "Constant": "FP32 FP16 BF16 INT32 INT64 BOOL",
        "ConstantOfShape": "FP32 FP16 BF16 INT32 INT64 BOOL",
        "Conv": "FP32 FP16 BF16",
        "Div": "FP32 FP16 BF16 INT32 INT64",
        "Equal": "FP32 FP16 BF16 INT32 INT64",
        "Erf": "FP32 FP16 BF16",
        "Expand": "FP32 FP16 BF16 INT32 INT64 BOOL",
        "Flatten": "FP32 FP16 BF16 INT32 INT64 BOOL",
        "Gather": "FP32 FP16 BF16 INT32 INT64 BOOL",
        "Gemm": "FP32 FP16 BF16",
        "Identity": "FP32 FP16 BF16 INT32 INT64 BOOL",
        "LayerNormalization": "FP32 FP16 BF16",
        "MatMul": "FP32 FP16 BF16",
        "Mul": "FP32 FP16 BF16 INT32 INT64",
        "Pow": "FP32 FP16 BF16",
        "Range": "FP32 FP16 BF16 INT32 INT64",
        "ReduceMean": "FP32 FP16 BF16 INT32 INT64",
        "Reshape": "FP32 FP16 BF16 INT32 INT64 BOOL",
        "Shape": "FP32 FP16 BF16 INT32 INT64 BOOL",
        "Sigmoid": "FP32 FP16 BF16",
        "Slice": "FP32 FP16 BF16 INT32 INT64 BOOL",
        "Softmax": "FP32 FP16 BF16",
        "Split": "FP32 FP16 BF16 INT32 INT64 BOOL",
        "Sqrt": "FP32 FP16 BF16",
        "Squeeze": "FP32 FP16 BF16 INT32 INT64 BOOL",
        "Sub": "FP32 FP16 BF16 INT32 INT64",
        "Tanh": "FP32 FP16 BF16",
        "Transpose": "FP32 FP16 BF16 INT32 INT64 BOOL",
        "Unsqueeze": "FP32 FP16 BF16 INT32 INT64 BOOL",
        "Where": "FP32 FP16 BF16 INT32 INT64 BOOL",
    }.items()
}
_TYPE_NAMES = {
    TensorProto.FLOAT: "FP32",
    TensorProto.FLOAT16: "FP16",
    TensorProto.BFLOAT16: "BF16",
    TensorProto.INT32: "INT32",
    TensorProto.INT64: "INT64",
    TensorProto.UINT8: "UINT8",
    TensorProto.BOOL: "BOOL",
    TensorProto.DOUBLE: "DOUBLE",
    TensorProto.INT8: "INT8",
}


def uint8_only_into_cast(model: onnx.ModelProto) -> onnx.ModelProto:
    """Make the uint8 input feed nothing but its Cast (in place; returns ``model``).

    The exporter reads the symbolic batch size with ``Shape(pixels)``. A Shape reads only the
    shape, which the Cast's output has too, so it is re-pointed there; the Cast moves first to
    keep the node list topologically sorted. Any other reader of the uint8 tensor is an error.
    """
    nodes = model.graph.node
    (cast,) = [n for n in nodes if n.op_type == "Cast" and INPUT_NAME in n.input]
    for node in nodes:
        if node is cast or INPUT_NAME not in node.input:
            continue
        if node.op_type != "Shape":
            raise ValueError(f"{node.op_type} {node.name!r} reads the uint8 input; only Cast may")
        node.input[:] = [cast.output[0] if name == INPUT_NAME else name for name in node.input]
    moved = onnx.NodeProto()
    moved.CopyFrom(cast)
    nodes.remove(cast)
    nodes.insert(0, moved)
    return model


def tensor_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every named tensor, after ONNX shape inference."""
    inferred = shape_inference.infer_shapes(model)
    graph = inferred.graph
    types = {
        info.name: info.type.tensor_type.elem_type
        for info in (*graph.input, *graph.value_info, *graph.output)
    }
    types.update({init.name: init.data_type for init in graph.initializer})
    for node in graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    types[node.output[0]] = attr.t.data_type
    return types


def tensorrt_blockers(model: onnx.ModelProto) -> list[str]:
    """Why TensorRT could not take the whole graph as one engine (empty: it can)."""
    types = tensor_types(model)
    inputs = {i.name for i in model.graph.input}
    found = [
        f"uint8 tensor {name!r} is not a graph input"
        for name, kind in types.items()
        if kind == TensorProto.UINT8 and name not in inputs
    ]
    for node in model.graph.node:
        supported = TENSORRT_TYPES.get(node.op_type)
        if supported is None:
            found.append(f"{node.op_type} ({node.name}) is not in TensorRT's supported ops")
            continue
        for name in (*node.input, *node.output):
            if not name:  # an omitted optional input
                continue
            kind = _TYPE_NAMES.get(types.get(name, TensorProto.UNDEFINED), "UNKNOWN")
            if kind not in supported:
                found.append(f"{node.op_type} ({node.name}) has {kind} tensor {name!r}")
    return found
