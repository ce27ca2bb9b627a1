"""The one resize compact JPEGs need (a 256-px centre square to the 224 px ViT-B models take,
open_clip's antialiased bicubic) as an ONNX graph of its own: what it would cost inside the
model's graph on a provider, beside what pillow-simd costs the gateway's CPU for the same pixels,
and how far its output lands from Pillow's (issue 41's question; on ONNX Runtime's CPU EP it was
2.6x pillow-simd's CPU per image, 0.21 levels apart: ``git checkout c84860a && python -m bench
graph-resize``). ``bench host`` runs it with its ceilings, on the GPU where there is one.

The graph takes uint8 ``[N, 256, 256, 3]`` (what the gateway would send instead of 224 px) and
gives float ``[N, 3, 224, 224]``: Cast, Transpose, then ``Resize`` (opset 18: cubic, a = -0.5,
antialias, half-pixel), the ops a model's graph would start with. On the CUDA EP its output stays
on the device (an IOBinding), as it would feed the model there, and a node the EP cannot run
fails the session instead of falling back to the CPU unseen."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from bench.harness import engine

SIDE, SIZE = 256, 224


def graph(side: int = SIDE, size: int = SIZE) -> bytes:
    from onnx import TensorProto, checker, helper

    def ints(name: str, values: list[int]) -> Any:
        return helper.make_tensor(name, TensorProto.INT64, [len(values)], values)

    nodes = [
        helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT),
        helper.make_node("Transpose", ["xf"], ["xt"], perm=[0, 3, 1, 2]),
        helper.make_node("Shape", ["xt"], ["shape"]),
        helper.make_node("Slice", ["shape", "zero", "one"], ["n"]),
        helper.make_node("Concat", ["n", "chw"], ["sizes"], axis=0),
        helper.make_node(
            "Resize", ["xt", "", "", "sizes"], ["y"], mode="cubic", cubic_coeff_a=-0.5,
            antialias=1, coordinate_transformation_mode="half_pixel", exclude_outside=0,
        ),
    ]  # fmt: skip
    model = helper.make_model(
        helper.make_graph(
            nodes, "resize",
            [helper.make_tensor_value_info("x", TensorProto.UINT8, [None, side, side, 3])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 3, size, size])],
            [ints("zero", [0]), ints("one", [1]), ints("chw", [3, size, size])],
        ),
        opset_imports=[helper.make_opsetid("", 18)],
        ir_version=9,
    )  # fmt: skip
    checker.check_model(model)
    return bytes(model.SerializeToString())


def squares(count: int = 32) -> np.ndarray:
    """Compact JPEGs' (256 px short side) centre squares, decoded: ``[count, 256, 256, 3]``."""
    import simplejpeg

    from bench.harness.photos import compact_jpeg

    out = []
    for i in range(count):
        image = simplejpeg.decode_jpeg(compact_jpeg(1000 + i), colorspace="RGB")
        left, top = (image.shape[1] - SIDE) // 2, (image.shape[0] - SIDE) // 2
        out.append(image[top : top + SIDE, left : left + SIDE])
    return np.ascontiguousarray(np.stack(out))


def pillow(batch: np.ndarray) -> np.ndarray:
    """What the gateway's resize makes of the squares (pillow-simd where installed)."""
    from PIL import Image

    return np.stack([
        np.asarray(Image.fromarray(square).resize((SIZE, SIZE), Image.Resampling.BICUBIC))
        for square in batch
    ])  # fmt: skip


def _cpu_us_per_image(run: Any, images: int, seconds: float) -> float:
    run()
    cpu, started, done = time.process_time(), time.perf_counter(), 0
    while time.perf_counter() - started < seconds or done == 0:
        run()
        done += images
    return round(1e6 * (time.process_time() - cpu) / done, 1)


def measure(provider: str, batches: tuple[int, ...], seconds: float) -> dict[str, Any]:
    """The graph's images/s and this process's CPU per image by batch on ``provider``; Pillow's
    CPU per image for the same squares; the graph's output against Pillow's, in levels."""
    import onnxruntime as ort

    pixels = squares()
    options = ort.SessionOptions()
    providers: list[Any] = [provider]
    if provider == "CUDAExecutionProvider":
        providers = [(provider, engine.CUDA_OPTIONS)]
        options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    session = ort.InferenceSession(graph(), options, providers=providers)
    device = "cuda" if provider == "CUDAExecutionProvider" else "cpu"
    found: dict[str, Any] = {"provider": provider, "graph": {}}
    output = None
    for batch in batches:
        feed = np.ascontiguousarray(np.resize(pixels, (batch, SIDE, SIDE, 3)))
        binding = session.io_binding()
        binding.bind_cpu_input("x", feed)
        binding.bind_output("y", device)  # on the GPU it stays there, as it would feed the model

        def run(b: Any = binding) -> None:
            session.run_with_iobinding(b)

        rate = engine.rate(run, batch, seconds)
        rate["cpu_us_per_image"] = _cpu_us_per_image(run, batch, seconds / 2)
        found["graph"][str(batch)] = rate
        if output is None or len(output) < len(pixels) <= batch:
            output = binding.copy_outputs_to_cpu()[0][: len(pixels)]  # feed's first rows
    found["pillow_cpu_us_per_image"] = _cpu_us_per_image(lambda: pillow(pixels), len(pixels),
                                                         seconds)  # fmt: skip
    assert output is not None
    got = np.clip(np.round(output.transpose(0, 2, 3, 1)), 0, 255)
    diff = np.abs(got - pillow(pixels[: len(got)]).astype(np.float32))
    found["vs_pillow"] = {"mean_abs_levels": round(float(diff.mean()), 3),
                          "max_levels": int(diff.max()),
                          "identical": round(float((diff == 0).mean()), 3)}  # fmt: skip
    return found
