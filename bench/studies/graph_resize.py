"""``python -m bench graph-resize``: would the compact JPEGs' resize be cheaper inside the model's
graph than on the gateway's CPU (issue 41)? The one common shape that needs resampling: a 256-px
centre square (what a compact JPEG is after its crop) to the 224 px ViT-B/32 takes, open_clip's
bicubic with antialiasing. ONNX Resize (opset 18: cubic, a = -0.5, antialias, half-pixel) on
ONNX Runtime's CPU provider, one and two threads, against pillow-simd's resize of the same
pixels; then the ONNX result against Pillow's in levels of 255 (what moving the resize into the
graph would do to fidelity). A GPU's provider is not measured here (none on this machine).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial

SIZE, SIDE, BATCH, PASSES = 224, 256, 32, 5


def _graph() -> bytes:
    from onnx import TensorProto, checker, helper

    def ints(name: str, values: list[int]) -> TensorProto:
        return helper.make_tensor(name, TensorProto.INT64, [len(values)], values)

    nodes = [
        helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT),
        helper.make_node("Transpose", ["xf"], ["xt"], perm=[0, 3, 1, 2]),
        helper.make_node("Shape", ["xt"], ["shape"]),
        helper.make_node("Slice", ["shape", "zero", "one"], ["n"]),
        helper.make_node("Concat", ["n", "chw"], ["sizes"], axis=0),
        helper.make_node(
            "Resize",
            ["xt", "", "", "sizes"],
            ["y"],
            mode="cubic",
            cubic_coeff_a=-0.5,
            antialias=1,
            coordinate_transformation_mode="half_pixel",
            exclude_outside=0,
        ),
    ]
    graph = helper.make_graph(
        nodes, "resize",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [None, SIDE, SIDE, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 3, SIZE, SIZE])],
        [ints("zero", [0]), ints("one", [1]), ints("chw", [3, SIZE, SIZE])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    checker.check_model(model)
    return bytes(model.SerializeToString())


def _cpu_us_per_image(run: Callable[[], object]) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(PASSES):
        run()
    per = PASSES * BATCH / 1e6
    return (time.process_time() - cpu) / per, (time.perf_counter() - wall) / per


def main(argv: list[str]) -> int:
    del argv  # no options
    import numpy as np
    import onnxruntime as ort
    import PIL
    import simplejpeg
    from PIL import Image

    from bench.harness.photos import compact_jpeg

    decoded = [simplejpeg.decode_jpeg(compact_jpeg(1000 + i), colorspace="RGB") for i in range(32)]
    squares = [a[:, (a.shape[1] - SIDE) // 2 : (a.shape[1] - SIDE) // 2 + SIDE] for a in decoded]
    batch = np.ascontiguousarray(np.stack(squares))
    graph, out = _graph(), None
    for threads in (1, 2):
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        session = ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
        session.run(None, {"x": batch})
        out = session.run(None, {"x": batch})[0]
        cpu, wall = _cpu_us_per_image(partial(session.run, None, {"x": batch}))
        print(f"ONNX Runtime CPU, {threads} thread(s): {cpu:.0f} us CPU, {wall:.0f} us wall each")

    def pillow() -> list[Image.Image]:
        return [Image.fromarray(s).resize((SIZE, SIZE), Image.Resampling.BICUBIC) for s in squares]

    cpu, wall = _cpu_us_per_image(pillow)
    print(f"Pillow ({PIL.__version__}) on the gateway's CPU: {cpu:.0f} us CPU per image")
    reference = np.stack([np.asarray(image) for image in pillow()]).astype(np.float32)
    assert out is not None
    got = np.clip(np.round(out.transpose(0, 2, 3, 1)), 0, 255)
    diff = np.abs(got - reference)
    print(
        f"ONNX Resize vs Pillow: mean abs {diff.mean():.3f} levels, max {diff.max():.0f}, "
        f"identical {(diff == 0).mean():.1%} of values"
    )
    return 0
