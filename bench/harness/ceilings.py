"""What this CPU can do at all, measured with ONNX Runtime in the same run as the peers: the FP32
and INT8 GEMM ceilings (one 4096² MatMul / MatMulInteger), and the model alone (an ORT session
on the exported graph, no server) at batch 32 and 1.

The ceilings bound any model's speed here: ViT-B/32 does ``VIT_B32_GOP`` of multiply-adds per
image, so ceiling / that is the most images per second any engine could reach, and the model
alone against it says how much of the machine the graph (its GEMMs and everything between
them) actually uses.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

#: Giga-operations (2 per multiply-add) per image of ViT-B/32 at 224 px: the patch convolution
#: (49 x 3072 x 768), per block the qkv (50 x 768 x 2304), attention (2 x 12 x 50 x 50 x 64),
#: output (50 x 768²) and MLP (2 x 50 x 768 x 3072) products, x 12 blocks, and the 768 x 512
#: projection: 4.41 G multiply-adds.
VIT_B32_GOP = 2 * (49 * 3072 * 768 + 12 * (50 * 768 * 2304 + 2 * 12 * 50 * 50 * 64
                   + 50 * 768 * 768 + 2 * 50 * 768 * 3072) + 768 * 512) / 1e9  # fmt: skip


def session(model: Any, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    source = model if isinstance(model, str | Path) else model.SerializeToString()
    return ort.InferenceSession(str(source) if isinstance(source, Path) else source, options,
                                providers=["CPUExecutionProvider"])  # fmt: skip


def _timed(run: Any, reps: int) -> float:
    """Median seconds of ``reps`` calls after one warm-up call."""
    run()
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return float(np.median(times))


def _gemm(op: str, n: int) -> tuple[Any, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    if op == "MatMul":
        weight = rng.standard_normal((n, n)).astype(np.float32)
        a, a_type, y_type = rng.standard_normal((n, n)).astype(np.float32), TensorProto.FLOAT, 1
    else:  # u8 x s8, what the quantized graphs run
        weight = rng.integers(-127, 128, (n, n)).astype(np.int8)
        a, a_type, y_type = rng.integers(0, 256, (n, n)).astype(np.uint8), TensorProto.UINT8, 6
    graph = helper.make_graph(
        [helper.make_node(op, ["A", "W"], ["Y"])], "gemm",
        [helper.make_tensor_value_info("A", a_type, [n, n])],
        [helper.make_tensor_value_info("Y", y_type, [n, n])],
        [numpy_helper.from_array(weight, "W")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    return model, {"A": a}


def gemm_ceilings(n: int = 4096, threads: int = 2, reps: int = 5) -> dict[str, float]:
    """GFLOP/s (FP32 MatMul) and GOP/s (INT8 MatMulInteger) on an n x n x n product."""
    found = {}
    for op, key in (("MatMul", "fp32_gflops"), ("MatMulInteger", "int8_gops")):
        model, feeds = _gemm(op, n)
        run = session(model, threads)
        seconds = _timed(lambda run=run, feeds=feeds: run.run(None, feeds), reps)
        found[key] = round(2 * n**3 / seconds / 1e9, 1)
    found |= {"n": n, "threads": threads}
    return found


def model_alone(path: Path, input_name: str, image_size: int, threads: int = 2,
                reps: int = 5) -> dict[str, float]:  # fmt: skip
    """Images per second at batch 32 and milliseconds at batch 1, an ORT session on ``path``."""
    run = session(path, threads)
    pixels = np.random.default_rng(0).integers(0, 256, (32, image_size, image_size, 3), np.uint8)
    batch32 = _timed(lambda: run.run(None, {input_name: pixels}), max(2, reps // 2))
    single = _timed(lambda: run.run(None, {input_name: pixels[:1]}), reps * 4)
    return {"batch32_img_s": round(32 / batch32, 1), "batch1_ms": round(single * 1000, 1)}
