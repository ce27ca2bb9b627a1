"""The exported ONNX graphs of both towers: contract, parity with open_clip, the manifest, the
model family (a SigLIP model), caching, where weights come from."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import open_clip
import pytest
import torch
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from clip_gateway.config.settings import PROFILES, RepositorySettings
from clip_gateway.export import parity
from clip_gateway.export.build import ensure_exported
from clip_gateway.export.graph import tensorrt_blockers
from clip_gateway.export.model import load
from clip_gateway.launcher.repository import render
from clip_gateway.model.contract import (
    INPUT_NAME,
    OUTPUT_NAME,
    TEXT_CANARY,
    TEXT_INPUT_NAME,
    TEXT_MODEL_NAME,
    TEXT_OUTPUT_NAME,
    TRITON_MODEL_NAME,
    decode_reference,
)
from clip_gateway.model.spec import ExportedModel, Weights
from clip_gateway.text.tokenizer import ClipBpeTokenizer
from tests import exports, reference

ROOT = Path(__file__).resolve().parents[2]
ONNX_TO_TRITON = {
    onnx.TensorProto.UINT8: mc.TYPE_UINT8,
    onnx.TensorProto.INT32: mc.TYPE_INT32,
    onnx.TensorProto.FLOAT: mc.TYPE_FP32,
}
SIGLIP = "ViT-B-16-SigLIP"
TEXTS = ["a photo of a dog", "a diagram of the solar system", "東京の夜景 at night", "x" * 300, ""]


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


def test_tensorrt_can_take_the_whole_graph(exported) -> None:
    """The FP32 graph, which the tensorrt profile loads: no uint8 tensor but the input, which
    feeds only its Cast; every node an op TensorRT's ONNX parser takes, for the types it has
    (clip_gateway/export/graph.py walks the inferred graph)."""
    model = onnx.load(str(exported.fp32))
    assert [n.op_type for n in model.graph.node if INPUT_NAME in n.input] == ["Cast"]
    assert tensorrt_blockers(model) == []
    assert exported.manifest["tensorrt_blockers"][exported.fp32.name] == []


@pytest.mark.parametrize("tower", ["image", "text"])
def test_fp16_graph_has_onnx_runtimes_fusions(exported, tower: str) -> None:
    """The CUDA EP's FP16 graph: every residual LayerNorm and every GELU of the 12 blocks fused
    into ONNX Runtime's kernels (1.34x images/s on an H100, bench/results/gpu), as the manifest
    records; the uint8 input still feeds only its Cast, and the FP32 graph has no contrib op."""
    path = exported.fp16 if tower == "image" else exported.text_fp16
    model = onnx.load(str(path))
    fused = {"SkipLayerNormalization": 24, "BiasGelu": 12}
    assert {op: n for op, n in onnx_fused(model).items() if op in fused} == fused
    assert exported.manifest["towers"][tower]["fp16_fused_ops"] == onnx_fused(model)
    if tower == "image":
        assert [n.op_type for n in model.graph.node if INPUT_NAME in n.input] == ["Cast"]
    fp32 = exported.fp32 if tower == "image" else exported.text_fp32
    assert onnx_fused(onnx.load(str(fp32))) == {}


def onnx_fused(model: onnx.ModelProto) -> dict[str, int]:
    """Contrib ops by type, counted here rather than with the exporter's own helper."""
    ops = [n.op_type for n in model.graph.node if n.domain == "com.microsoft"]
    return {op: ops.count(op) for op in sorted(set(ops))}


def assert_repository_agrees(exported: ExportedModel, out: Path) -> dict[str, mc.ModelConfig]:
    """Render every profile; each model's config names, types and dims are its graph's."""
    graphs = {TRITON_MODEL_NAME: exported.fp32, TEXT_MODEL_NAME: exported.text_fp32}
    configs = {}
    # the INT8 profiles need files built from the export: `--int8` for cpu-int8
    # (tests/integration/test_int8.py checks those graphs), NNCF's at a cpu-int8-openvino start
    # (tests/integration/test_int8_openvino_served.py)
    for profile in [p for p in PROFILES if p not in ("cpu-int8", "cpu-int8-openvino")]:
        repo = render(RepositorySettings(profile=profile), exported.directory, out / profile)
        # a text model only where the gateway can tokenise for it
        has_text = exported.manifest["tokenizer"]["available"]
        served = [TRITON_MODEL_NAME, TEXT_MODEL_NAME][: 2 if has_text else 1]
        assert sorted(p.name for p in repo.iterdir()) == sorted(served)
        for model_dir in repo.iterdir():
            config = text_format.Parse((model_dir / "config.pbtxt").read_text(), mc.ModelConfig())
            graph = onnx.load(str(graphs[config.name]), load_external_data=False).graph
            for tensors, graph_tensors in (
                (config.input, graph.input),
                (config.output, graph.output),
            ):
                assert [t.name for t in tensors] == [g.name for g in graph_tensors]
                for t, g in zip(tensors, graph_tensors, strict=True):
                    assert t.data_type == ONNX_TO_TRITON[g.type.tensor_type.elem_type]
                    assert list(t.dims) == dims(g)[1:]  # Triton's dims exclude the batch axis
            filename = config.default_model_filename
            if profile == "cpu":
                assert (model_dir / "1" / "model.py").exists()
                filename = config.parameters["onnx_file"].string_value
            assert (model_dir / "1" / filename).resolve().exists()
            configs[f"{profile}/{config.name}"] = config
    return configs


def test_rendered_configs_agree_with_the_graphs(exported, tmp_path: Path) -> None:
    configs = assert_repository_agrees(exported, tmp_path)
    text = configs[f"cpu/{TEXT_MODEL_NAME}"]
    assert text.parameters["context_length"].string_value == "77"
    assert text.parameters["tokenizer"].string_value == "clip_bpe"
    tokenizer = ClipBpeTokenizer.from_file(text.parameters["tokenizer_file"].string_value, 77)
    np.testing.assert_array_equal(tokenizer.tokenize(TEXTS), reference.tokens(TEXTS))
    assert configs[f"cuda/{TEXT_MODEL_NAME}"].default_model_filename == "text_fp16.onnx"


@pytest.mark.parametrize("variant", ["fp32", "fp16"])
def test_text_graph_contract(exported, variant: str) -> None:
    path = exported.text_fp32 if variant == "fp32" else exported.text_fp16
    model = onnx.load(str(path), load_external_data=False)
    onnx.checker.check_model(model)
    (inp,), (out,) = model.graph.input, model.graph.output
    assert inp.name == TEXT_INPUT_NAME and out.name == TEXT_OUTPUT_NAME
    assert inp.type.tensor_type.elem_type == onnx.TensorProto.INT32
    assert out.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    batch, *rest = dims(inp)
    assert isinstance(batch, str) and rest == [77]
    assert dims(out)[1:] == [512]
    # the int64 that open_clip's embedding lookup and argmax pooling take is made in the graph
    readers = [n for n in model.graph.node if TEXT_INPUT_NAME in n.input]
    (cast,) = [n for n in readers if n.op_type != "Shape"]  # Shape: the batch size for pooling
    assert cast.op_type == "Cast" and cast.attribute[0].i == onnx.TensorProto.INT64


def test_text_parity_with_open_clip_in_torch(exported) -> None:
    """The text graphs on open_clip's own tokens against its ``encode_text`` (tests/reference)."""
    ids = reference.tokens(TEXTS)
    expected = reference.embed_tokens(ids)
    feeds = {TEXT_INPUT_NAME: ids.astype(np.int32)}
    fp32 = parity.session(exported.text_fp32).run(None, feeds)[0]
    fp16 = parity.session(exported.text_fp16).run(None, feeds)[0]
    max_abs = float(np.abs(fp32 - expected).max())
    cos16 = reference.cosines(fp16, expected)
    print(f"\ntext parity: fp32 max |d| {max_abs:.2e}, fp16 cosine min {cos16.min():.7f}")
    assert max_abs <= 1e-4  # measured 3.5e-6 on the CI machine
    assert cos16.min() >= 0.999  # measured 0.9999993
    assert exported.manifest["towers"]["text"]["parity"]["ok"]


def test_text_dynamic_batch_axis(exported) -> None:
    session = parity.session(exported.text_fp32)
    ids = reference.tokens(TEXTS).astype(np.int32)
    whole = session.run(None, {TEXT_INPUT_NAME: ids})[0]
    singles = [session.run(None, {TEXT_INPUT_NAME: ids[i : i + 1]})[0] for i in range(len(ids))]
    assert whole.shape == (len(TEXTS), 512)
    np.testing.assert_allclose(whole, np.concatenate(singles), atol=1e-5)


def test_text_canary_is_open_clips_embedding_of_the_canary_text(exported) -> None:
    text = exported.manifest["towers"]["text"]
    assert text["canary_text"] == TEXT_CANARY
    expected = reference.embed_tokens(reference.tokens([TEXT_CANARY]))[0]
    assert np.abs(decode_reference(text["canary_embedding"]) - expected).max() <= 1e-4


def test_manifest_has_what_the_gateway_serves_without_torch(exported) -> None:
    manifest = exported.manifest
    tag = open_clip.get_pretrained_cfg("ViT-B-32", "laion2b_s34b_b79k")
    assert manifest["preprocess"] == {
        "size": 224, "mean": list(tag["mean"]), "std": list(tag["std"]),
        "interpolation": "bicubic", "resize_mode": "shortest", "center_crop": True,
        "fill_color": None, "from_tag": "laion2b_s34b_b79k",
    }  # fmt: skip
    assert (manifest["image_size"], manifest["embed_dim"], manifest["context_length"]) == (
        224, 512, 77,
    )  # fmt: skip
    assert (manifest["mean"], manifest["std"]) == (list(tag["mean"]), list(tag["std"]))
    image, text = manifest["towers"]["image"], manifest["towers"]["text"]
    assert image["input"] == {"name": INPUT_NAME, "dtype": "uint8", "shape": [-1, 224, 224, 3]}
    assert text["input"] == {"name": TEXT_INPUT_NAME, "dtype": "int32", "shape": [-1, 77]}
    for tower in (image, text):
        assert tower["output"] == {"name": OUTPUT_NAME, "dtype": "float32", "shape": [-1, 512]}
        assert all((exported.directory / name).is_file() for name in tower["files"].values())
    assert (image["triton_model"], text["triton_model"]) == (TRITON_MODEL_NAME, TEXT_MODEL_NAME)
    tokenizer = manifest["tokenizer"]
    assert (tokenizer["kind"], tokenizer["available"], tokenizer["context_length"]) == (
        "clip_bpe", True, 77,
    )  # fmt: skip
    assert tokenizer["self_check"]["mismatches"] == 0
    assert (exported.directory / tokenizer["file"]).is_file()


def offline_hub(patch: pytest.MonkeyPatch, cache: Path) -> None:
    """The Hugging Face hub unreachable, its cache empty (huggingface_hub reads both at import)."""
    import huggingface_hub.constants

    patch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    patch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))


@pytest.fixture(scope="module")
def siglip(tmp_path_factory: pytest.TempPathFactory) -> ExportedModel:
    """A SigLIP model, random weights: squash resize, mean/std 0.5, a Hugging Face tokenizer
    whose files are not given and not fetched (the hub offline and its cache empty, as on a
    machine without them)."""
    with pytest.MonkeyPatch.context() as patch:
        hub = tmp_path_factory.mktemp("hub")
        offline_hub(patch, hub)  # here, and in the child that exports (tests/exports.py)
        offline = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub)}
        return exports.ensure_exported(SIGLIP, Weights.random(0), env=offline)


def test_siglip_exports_with_its_own_preprocessing_and_says_why_no_text(siglip) -> None:
    manifest = siglip.manifest
    tag = open_clip.get_pretrained_cfg(SIGLIP, "webli")
    preprocess = manifest["preprocess"]
    assert (preprocess["size"], preprocess["resize_mode"], preprocess["center_crop"]) == (
        224, "squash", False,
    )  # fmt: skip
    assert (preprocess["mean"], preprocess["std"]) == (list(tag["mean"]), list(tag["std"]))
    assert preprocess["mean"] == [0.5, 0.5, 0.5] and preprocess["from_tag"] == "webli"
    tokenizer = manifest["tokenizer"]
    assert (tokenizer["kind"], tokenizer["available"], manifest["context_length"]) == (
        "hf", False, 64,
    )  # fmt: skip
    # no tokenizer directory given and no hub here: the files are missing, and the reason says
    # which, and both ways to provide them (tests/integration/test_hf_text.py gives them)
    for part in ("'timm/ViT-B-16-SigLIP'", "tokenizer.json", "--tokenizer DIR", "CLIP_TOKENIZER",
                 "serves images only"):  # fmt: skip
        assert part in tokenizer["reason"]
    assert not (siglip.directory / "tokenizer.json").exists()
    assert "canary_embedding" not in manifest["towers"]["text"]  # nothing to tokenise it with


def test_siglip_towers_match_open_clip_and_render_for_every_profile(siglip, tmp_path) -> None:
    pixels = np.random.default_rng(5).integers(0, 256, size=(2, 224, 224, 3), dtype=np.uint8)
    image = parity.session(siglip.fp32).run(None, {INPUT_NAME: pixels})[0]
    image_abs = float(np.abs(image - reference.embed_pixels(pixels, name=SIGLIP)).max())
    ids = np.random.default_rng(6).integers(0, 32000, size=(3, 64))
    text = parity.session(siglip.text_fp32).run(None, {TEXT_INPUT_NAME: ids.astype(np.int32)})[0]
    text_abs = float(np.abs(text - reference.embed_tokens(ids, name=SIGLIP)).max())
    print(f"\nSigLIP parity: image max |d| {image_abs:.2e}, text max |d| {text_abs:.2e}")
    assert image_abs <= 1e-4  # measured 9.5e-7
    assert text_abs <= 1e-4  # measured 4.1e-6
    configs = assert_repository_agrees(siglip, tmp_path)
    reason = configs[f"cpu/{TRITON_MODEL_NAME}"].parameters["text_unavailable_reason"].string_value
    assert reason == siglip.manifest["tokenizer"]["reason"]


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
    from clip_gateway.model.spec import cache_key

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
        [sys.executable, "-m", "clip_gateway.export", *args],
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
