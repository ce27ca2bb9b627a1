"""clip_gateway/export/graph.py on hand-built graphs: what keeps TensorRT from taking a graph whole
is found, and the uint8 input is rewired to feed only its Cast (the exported graph:
test_export.py)."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from clip_gateway.export.graph import tensorrt_blockers, uint8_only_into_cast
from clip_gateway.model.contract import INPUT_NAME


def graph(*nodes: onnx.NodeProto) -> onnx.ModelProto:
    pixels = helper.make_tensor_value_info(INPUT_NAME, TensorProto.UINT8, ["batch", 4, 4, 3])
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 3, 4, 4])
    model = helper.make_model(
        helper.make_graph(list(nodes), "g", [pixels], [out]),
        opset_imports=[helper.make_opsetid("", 18)],
    )
    return model


def permute_then_cast() -> onnx.ModelProto:
    """What clip_gateway/export/model.py produced before: Shape and Transpose on the uint8 input."""
    return graph(
        helper.make_node("Shape", [INPUT_NAME], ["batch"], start=0, end=1),
        helper.make_node("Transpose", [INPUT_NAME], ["nchw_u8"], perm=[0, 3, 1, 2]),
        helper.make_node("Cast", ["nchw_u8"], ["nchw"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["batch"], ["batch_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["nchw", "batch_f"], ["out"]),
    )


def cast_then_permute() -> onnx.ModelProto:
    """The exporter's order now, before rewiring: Shape still reads the uint8 input."""
    return graph(
        helper.make_node("Shape", [INPUT_NAME], ["batch"], start=0, end=1),
        helper.make_node("Cast", [INPUT_NAME], ["nhwc"], to=TensorProto.FLOAT),
        helper.make_node("Transpose", ["nhwc"], ["nchw"], perm=[0, 3, 1, 2]),
        helper.make_node("Cast", ["batch"], ["batch_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["nchw", "batch_f"], ["out"]),
    )


def test_permuting_uint8_is_found() -> None:
    found = tensorrt_blockers(permute_then_cast())
    assert any("'nchw_u8' is not a graph input" in f for f in found)
    assert any(f.startswith("Transpose") and "UINT8" in f for f in found)
    assert any(f.startswith("Shape") and "UINT8" in f for f in found)


def test_cast_first_then_rewired_has_no_blocker() -> None:
    model = cast_then_permute()
    assert any(f.startswith("Shape") for f in tensorrt_blockers(model))
    rewired = uint8_only_into_cast(model)
    onnx.checker.check_model(rewired, full_check=True)  # still topologically sorted
    assert [n.op_type for n in rewired.graph.node if INPUT_NAME in n.input] == ["Cast"]
    assert rewired.graph.node[0].op_type == "Cast"
    assert tensorrt_blockers(rewired) == []


def test_only_shape_may_be_rewired() -> None:
    with pytest.raises(ValueError, match="Transpose"):
        uint8_only_into_cast(
            graph(
                helper.make_node("Cast", [INPUT_NAME], ["f"], to=TensorProto.FLOAT),
                helper.make_node("Transpose", [INPUT_NAME], ["t"], perm=[0, 3, 1, 2]),
                helper.make_node("Identity", ["f"], ["out"]),
            )
        )


def test_an_op_tensorrt_lacks_or_a_type_it_rejects_is_found() -> None:
    model = graph(
        helper.make_node("Cast", [INPUT_NAME], ["f"], to=TensorProto.DOUBLE),
        helper.make_node("NonZero", ["f"], ["nz"]),
        helper.make_node("Cast", ["f"], ["out"], to=TensorProto.FLOAT),
    )
    found = tensorrt_blockers(model)
    assert any(f.startswith("NonZero") and "not in TensorRT's supported ops" in f for f in found)
    assert any(f.startswith("Cast") and "DOUBLE" in f for f in found)
