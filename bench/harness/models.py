"""The bench's model repositories: ours, baseline B's FP32-NCHW twin of the same file, a null model.

Baseline B ("Triton raw tensor") sends normalised FP32 NCHW tensors, so it needs a graph that
starts after our in-graph preprocessing. It is cut out of our own exported ``model.onnx`` with
``onnx.utils.extract_model`` (same weights, same nodes from the patch-embedding convolution on),
and checked against it before any number is taken.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from clip_gateway.config.settings import RepositorySettings
from clip_gateway.launcher.repository import render
from clip_gateway.model.contract import INPUT_NAME, OUTPUT_NAME, TRITON_MODEL_NAME

RAW_MODEL = "clip_raw"
RAW_INPUT = "input"
RAW_FILE = "model_raw.onnx"
NULL_MODEL_SOURCE = Path(__file__).parents[1] / "triton_null" / "model.py"


def extract_raw(source: Path, target: Path) -> None:
    """FP32 ``[n, 3, S, S]`` (already normalised) in, the same embedding out."""
    model = onnx.load(str(source))
    conv = next(node for node in model.graph.node if node.op_type == "Conv")
    cut = conv.input[0]
    nodes = list(model.graph.node)
    # The preprocessing prefix: every tensor computed before the cut (uint8 input, its Cast,
    # the transpose, the normalisation).
    prefix = {INPUT_NAME}
    for node in nodes[: next(i for i, n in enumerate(nodes) if cut in n.output)]:
        prefix.update(node.output)
    # Shape(<prefix tensor>)[0:1] is the batch size, which the cut tensor has too: re-point
    # those Shape nodes at it (moved after its producer, keeping the graph sorted); the rest of
    # the prefix is dropped by the extraction below.
    moved = [n for n in nodes if n.op_type == "Shape" and set(n.input) & (prefix - {cut})]
    for node in moved:
        bounds = {a.name: a.i for a in node.attribute}
        assert bounds == {"start": 0, "end": 1}, f"{node.name} reads more than the batch size"
    for node in moved:
        node.input[:] = [cut if name in prefix else name for name in node.input]
        nodes.remove(node)
    producer = next(i for i, n in enumerate(nodes) if cut in n.output)
    nodes[producer + 1 : producer + 1] = moved
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    staging = target.with_suffix(".full.onnx")
    onnx.save(model, str(staging))
    onnx.utils.extract_model(str(staging), str(target), [cut], [OUTPUT_NAME])
    staging.unlink()
    raw = onnx.load(str(target))
    for node in raw.graph.node:
        node.input[:] = [RAW_INPUT if name == cut else name for name in node.input]
    raw.graph.input[0].name = RAW_INPUT
    dims = raw.graph.input[0].type.tensor_type.shape.dim
    dims[0].dim_param = "batch"
    onnx.checker.check_model(raw)
    onnx.save(raw, str(target))


def check_raw_equivalence(ours: Path, raw: Path, mean: list[float], std: list[float]) -> float:
    """max |Δ| between our graph on uint8 pixels and the raw graph on the same, normalised."""
    import onnxruntime as ort

    pixels = np.random.default_rng(0).integers(0, 256, (2, 224, 224, 3), dtype=np.uint8)
    normalised = (pixels.transpose(0, 3, 1, 2) / 255.0 - np.array(mean)[:, None, None]) / np.array(
        std
    )[:, None, None]
    a = ort.InferenceSession(str(ours)).run(None, {INPUT_NAME: pixels})[0]
    b = ort.InferenceSession(str(raw)).run(None, {RAW_INPUT: normalised.astype(np.float32)})[0]
    return float(np.abs(a - b).max())


def bench_repository(export_dir: Path, out: Path, profile: str = "cpu") -> Path:
    """Our model (``clip_image``) and baseline B's ``clip_raw``, in one Triton repository."""
    render(RepositorySettings(profile=profile), export_dir, out)
    raw_dir = out / RAW_MODEL / "1"
    raw_dir.mkdir(parents=True, exist_ok=True)
    extract_raw(export_dir / "model.onnx", raw_dir / RAW_FILE)
    ours = out / TRITON_MODEL_NAME
    config = text_format.Parse((ours / "config.pbtxt").read_text(), mc.ModelConfig())
    config.name = RAW_MODEL
    size = config.input[0].dims[0]
    del config.input[:]
    config.input.add(name=RAW_INPUT, data_type=mc.TYPE_FP32, dims=[3, size, size])
    del config.model_warmup[:]
    if "canary_embedding" in config.parameters:
        del config.parameters["canary_embedding"]
    if config.backend == "python":
        config.parameters["onnx_file"].string_value = RAW_FILE
        shutil.copy2(ours / "1" / "model.py", raw_dir / "model.py")
    else:
        config.default_model_filename = RAW_FILE
        for accelerator in config.optimization.execution_accelerators.gpu_execution_accelerator:
            for key, value in list(accelerator.parameters.items()):
                if key.startswith("trt_profile_"):
                    batch = value.split(":")[1].split("x")[0]
                    accelerator.parameters[key] = f"{RAW_INPUT}:{batch}x3x{size}x{size}"
    (out / RAW_MODEL / "config.pbtxt").write_text(text_format.MessageToString(config))
    return out


def null_repository(export_dir: Path, out: Path) -> Path:
    """``clip_image`` with our exact signature but no model: isolates the gateway's capacity."""
    render(RepositorySettings(profile="cpu", warmup_batch_sizes=(1,)), export_dir, out)
    model_dir = out / TRITON_MODEL_NAME
    config = text_format.Parse((model_dir / "config.pbtxt").read_text(), mc.ModelConfig())
    del config.parameters["canary_embedding"]  # the canary then checks consistency only
    (model_dir / "config.pbtxt").write_text(text_format.MessageToString(config))
    for onnx_file in (model_dir / "1").glob("*.onnx"):
        onnx_file.unlink()
    shutil.copy2(NULL_MODEL_SOURCE, model_dir / "1" / "model.py")
    return out
