"""The exported ONNX graphs: contract, parity with open_clip, caching, where weights come from."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from export import parity
from export.build import ensure_exported
from export.graph import tensorrt_blockers
from export.model import load
from export.spec import Weights
from gateway.backend.contract import INPUT_NAME, OUTPUT_NAME
from gateway.backend.repository import render
from gateway.runtime.settings import PROFILES, RepositorySettings
from tests import reference

ROOT = Path(__file__).resolve().parents[2]
ONNX_TO_TRITON = {onnx.TensorProto.UINT8: mc.TYPE_UINT8, onnx.TensorProto.FLOAT: mc.TYPE_FP32}


def dims(value_info: onnx.ValueInfoProto) -> list[int | str]:
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


@pytest.mark.parametrize("variant", ["fp32", "fp16"])
def test_graph_contract(exported, variant: str) -> None:
    path = exported.fp32 if variant == "fp32" else exported.fp16
    model = onnx.load(str(path), load_external_data=False)
    onnx.checker.check_model(model)
    assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 17
    (inp,), (out,) = model.graph.input, model.graph.output
    assert inp.name == INPUT_NAME and out.name == OUTPUT_NAME
    assert inp.type.tensor_type.elem_type == onnx.TensorProto.UINT8
    # FP16 keeps FP32 at its output so every profile speaks the same contract
    assert out.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    batch, *rest = dims(inp)
    assert isinstance(batch, str) and rest == [224, 224, 3]  # symbolic batch axis
    assert dims(out)[1:] == [512]


@pytest.mark.parametrize("variant", ["fp32", "fp16"])
def test_tensorrt_can_take_the_whole_graph(exported, variant: str) -> None:
    """No uint8 tensor but the input, which feeds only its Cast; every node an op TensorRT's
    ONNX parser takes, for the types it has (export/graph.py walks the inferred graph)."""
    path = exported.fp32 if variant == "fp32" else exported.fp16
    model = onnx.load(str(path))
    assert [n.op_type for n in model.graph.node if INPUT_NAME in n.input] == ["Cast"]
    assert tensorrt_blockers(model) == []
    assert exported.manifest["tensorrt_blockers"][path.name] == []


def test_rendered_configs_agree_with_the_graph(exported, tmp_path: Path) -> None:
    graph = onnx.load(str(exported.fp32), load_external_data=False).graph
    for profile in PROFILES:
        repo = render(RepositorySettings(profile=profile), exported.directory, tmp_path / profile)
        model_dir = next(repo.iterdir())
        config = text_format.Parse((model_dir / "config.pbtxt").read_text(), mc.ModelConfig())
        for tensors, graph_tensors in ((config.input, graph.input), (config.output, graph.output)):
            assert [t.name for t in tensors] == [g.name for g in graph_tensors]
            for t, g in zip(tensors, graph_tensors, strict=True):
                assert t.data_type == ONNX_TO_TRITON[g.type.tensor_type.elem_type]
                assert list(t.dims) == dims(g)[1:]  # Triton's dims exclude the batch axis
        filename = config.default_model_filename or "model.onnx"
        if profile == "cpu":
            assert (model_dir / "1" / "model.py").exists()
            filename = config.parameters["onnx_file"].string_value
        assert (model_dir / "1" / filename).resolve().exists()


def test_parity_with_open_clip_in_torch(exported) -> None:
    """The exported graphs against open_clip's own model and normalisation (tests/reference.py,
    built without the exporter), on a fresh input and batch size."""
    pixels = np.random.default_rng(42).integers(0, 256, size=(3, 224, 224, 3), dtype=np.uint8)
    expected = reference.embed_pixels(pixels)
    fp32 = parity.session(exported.fp32).run(None, {INPUT_NAME: pixels})[0]
    fp16 = parity.session(exported.fp16).run(None, {INPUT_NAME: pixels})[0]
    max_abs = float(np.abs(fp32 - expected).max())
    cos16 = reference.cosines(fp16, expected)
    print(f"\nparity: fp32 max |d| {max_abs:.2e}, fp16 cosine min {cos16.min():.7f}")
    assert max_abs <= 1e-4  # measured 3.1e-6 to 5.2e-6 on the CI machine
    assert cos16.min() >= 0.999  # measured 0.9999998
    assert exported.manifest["parity"]["ok"]  # and the export recorded its own check passing


def test_dynamic_batch_axis(exported) -> None:
    session = parity.session(exported.fp32)
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, size=(5, 224, 224, 3), dtype=np.uint8)
    whole = session.run(None, {INPUT_NAME: x})[0]
    singles = np.concatenate([session.run(None, {INPUT_NAME: x[i : i + 1]})[0] for i in range(5)])
    assert whole.shape == (5, 512)
    np.testing.assert_allclose(whole, singles, atol=1e-5)


def test_a_cache_hit_reuses_the_export_and_keys_on_weights(exported) -> None:
    files = [exported.directory / name for name in ("manifest.json", "model.onnx")]
    before = [(f.stat().st_ino, f.stat().st_mtime_ns) for f in files]
    again = ensure_exported("ViT-B-32", Weights.random(0))
    assert again.directory == exported.directory
    assert [(f.stat().st_ino, f.stat().st_mtime_ns) for f in files] == before  # nothing rewritten
    assert exported.manifest["weights"]["id"] == "random:0"
    from export.spec import cache_key

    assert cache_key("ViT-B-32", Weights.random(0), True) != cache_key(
        "ViT-B-32", Weights.random(1), True
    )
    assert cache_key("ViT-B-32", Weights.random(0), True) != cache_key(
        "ViT-B-32", Weights.random(0), False
    )


def test_checkpoint_weights_are_loaded(exported, tmp_path: Path) -> None:
    """A checkpoint holding seed-0 weights exports to the same function as random seed 0."""
    loaded = load("ViT-B-32", Weights.random(0))
    checkpoint = tmp_path / "vit-b-32.pt"
    torch.save(loaded.clip.state_dict(), checkpoint)
    from_file = ensure_exported(
        "ViT-B-32", Weights.checkpoint(checkpoint), tmp_path / "cache", fp16=False
    )
    assert from_file.manifest["weights"]["kind"] == "checkpoint"
    assert from_file.fp16 is None
    x = np.random.default_rng(3).integers(0, 256, size=(2, 224, 224, 3), dtype=np.uint8)
    a = parity.session(exported.fp32).run(None, {INPUT_NAME: x})[0]
    b = parity.session(from_file.fp32).run(None, {INPUT_NAME: x})[0]
    np.testing.assert_allclose(a, b, atol=1e-6)


def run_export_cli(
    *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "export", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def test_unreachable_pretrained_weights_stop_with_both_alternatives(tmp_path: Path) -> None:
    # an empty hub cache, offline: the same answer whatever this machine has downloaded before
    hub = tmp_path / "hf"
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(hub), "HF_HUB_CACHE": str(hub / "hub")}
    result = run_export_cli("--cache-dir", str(tmp_path), env=env)
    assert result.returncode == 2
    assert "laion2b_s34b_b79k" in result.stderr
    assert "--checkpoint" in result.stderr and "--random-init" in result.stderr
    assert not list(tmp_path.glob("models/*/model.onnx"))  # never silently random


def test_missing_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    result = run_export_cli("--checkpoint", str(tmp_path / "nope.pt"), "--cache-dir", str(tmp_path))
    assert result.returncode == 2
    assert "nope.pt" in result.stderr


def test_cli_prints_the_cached_directory(exported) -> None:
    result = run_export_cli("--random-init", "--print-dir")
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()) == exported.directory
