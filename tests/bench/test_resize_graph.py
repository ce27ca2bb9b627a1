"""bench/harness/resize_graph.py: the compact JPEGs' resize as an ONNX graph (what ``bench host``
measures beside its ceilings) computes open_clip's antialiased bicubic, so its figures are those
of the same resize Pillow does on the gateway, not of a cheaper one."""

from __future__ import annotations

import numpy as np

from bench.harness import resize_graph


def test_the_graph_lands_within_a_level_of_pillow_and_reports_both_costs() -> None:
    found = resize_graph.measure("CPUExecutionProvider", (8,), 0.2)
    close = found["vs_pillow"]
    # 0.21 levels on average, at most 2 to 3, against Pillow's antialiased bicubic
    assert close["mean_abs_levels"] < 0.5 and close["max_levels"] <= 3, close
    assert close["identical"] > 0.5, close
    rate = found["graph"]["8"]
    assert rate["items_per_s"] > 0 and rate["cpu_us_per_image"] > 0
    assert found["pillow_cpu_us_per_image"] > 0


def test_without_antialiasing_it_would_not() -> None:
    """The comparison can tell: the same Resize without antialiasing misses Pillow's by more."""
    import onnx
    import onnxruntime as ort

    model = onnx.load_from_string(resize_graph.graph())
    (resize,) = [node for node in model.graph.node if node.op_type == "Resize"]
    for attribute in resize.attribute:
        if attribute.name == "antialias":
            attribute.i = 0
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    pixels = resize_graph.squares(4)
    got = np.clip(np.round(session.run(None, {"x": pixels})[0].transpose(0, 2, 3, 1)), 0, 255)
    assert np.abs(got - resize_graph.pillow(pixels).astype(np.float32)).mean() > 0.5
