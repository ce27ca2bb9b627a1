"""Rendered config.pbtxt files: valid for Triton's own schema, consistent across profiles, for
both models (clip_image, clip_text), and what the text model's parameters tell the gateway."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2 as mc

from clip_gateway.config.settings import PROFILES, RepositorySettings
from clip_gateway.launcher.repository import render, render_config, render_text_config
from clip_gateway.model.contract import (
    CANARY_PARAMETER,
    INPUT_NAME,
    OUTPUT_NAME,
    PREPROCESS_PARAMETER,
    QUANTIZATION_PARAMETER,
    TEXT_INPUT_NAME,
    TEXT_MODEL_NAME,
    TEXT_OUTPUT_NAME,
    TRITON_MODEL_NAME,
)

# The TensorRT-accelerator keys the onnxruntime backend understands (README "Parameter mapping"
# table and the key checks in src/onnxruntime.cc of triton-inference-server/onnxruntime_backend).
ORT_BACKEND_TRT_KEYS = {
    "precision_mode", "max_workspace_size_bytes", "trt_engine_cache_enable",
    "trt_engine_cache_path", "trt_timing_cache_enable", "trt_timing_cache_path",
    "trt_profile_min_shapes", "trt_profile_opt_shapes", "trt_profile_max_shapes",
    "trt_cuda_graph_enable", "trt_layer_norm_fp32_fallback", "trt_engine_cache_prefix",
    "trt_builder_optimization_level", "trt_max_partition_iterations", "trt_min_subgraph_size",
}  # fmt: skip


@pytest.fixture
def exported_stub(tmp_path: Path) -> Path:
    """An export directory's shape (manifest + ONNX files) without exporting anything."""
    directory = tmp_path / "export"
    directory.mkdir()
    (directory / "manifest.json").write_text('{"image_size": 224, "embed_dim": 512}')
    for name in ("model.onnx", "model_fp16.onnx"):
        (directory / name).write_bytes(b"onnx")
    return directory


def parse(config: mc.ModelConfig) -> mc.ModelConfig:
    """Round-trip through text: what Triton reads is what we check."""
    return text_format.Parse(text_format.MessageToString(config), mc.ModelConfig())


@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_has_the_same_tensor_contract(profile: str) -> None:
    config = parse(render_config(RepositorySettings(profile=profile), 224, 512))
    assert config.name == TRITON_MODEL_NAME
    assert config.max_batch_size == 32
    (inp,) = config.input
    assert (inp.name, inp.data_type, list(inp.dims)) == (INPUT_NAME, mc.TYPE_UINT8, [224, 224, 3])
    (out,) = config.output
    assert (out.name, out.data_type, list(out.dims)) == (OUTPUT_NAME, mc.TYPE_FP32, [512])
    assert list(config.dynamic_batching.preferred_batch_size) == [4, 8, 16, 32]


def test_settings_flow_into_every_profile() -> None:
    for profile in PROFILES:
        settings = RepositorySettings(
            profile=profile,
            max_batch_size=16,
            max_queue_delay_us=7500,
            instance_count=3,
            max_queue_size=9,
        )
        config = parse(render_config(settings, 224, 512))
        assert config.max_batch_size == 16
        # preferred sizes above the max are dropped rather than rejected by Triton at load
        assert list(config.dynamic_batching.preferred_batch_size) == [4, 8, 16]
        assert config.dynamic_batching.max_queue_delay_microseconds == 7500
        assert config.dynamic_batching.default_queue_policy.max_queue_size == 9
        assert (
            config.dynamic_batching.default_queue_policy.timeout_action
            == mc.ModelQueuePolicy.REJECT
        )
        assert [g.count for g in config.instance_group] == [3]


def test_cpu_profile_is_python_backend_with_ort() -> None:
    config = parse(render_config(RepositorySettings(profile="cpu", cpu_threads=2), 224, 512))
    assert config.backend == "python"
    assert config.instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU
    assert config.parameters["onnx_file"].string_value == "model.onnx"
    assert config.parameters["intra_op_threads"].string_value == "2"
    assert [w.batch_size for w in config.model_warmup] == [1]


def test_cpu_profile_on_the_native_onnxruntime_backend() -> None:
    """What the container runs without a GPU: its Python backend has no ONNX Runtime."""
    settings = RepositorySettings(profile="cpu", cpu_backend="onnxruntime", cpu_threads=3)
    config = parse(render_config(settings, 224, 512))
    assert config.backend == "onnxruntime"
    assert config.default_model_filename == "model.onnx"
    assert [g.kind for g in config.instance_group] == [mc.ModelInstanceGroup.KIND_CPU]
    assert not config.optimization.execution_accelerators.gpu_execution_accelerator
    assert config.parameters["intra_op_thread_count"].string_value == "3"  # the backend's key
    assert "onnx_file" not in config.parameters  # the Python model's keys are not rendered


def test_cpu_onnxruntime_repository_carries_no_python_model(
    exported_stub: Path, tmp_path: Path
) -> None:
    settings = RepositorySettings(profile="cpu", cpu_backend="onnxruntime")
    model_dir = render(settings, exported_stub, tmp_path / "repo") / TRITON_MODEL_NAME
    assert sorted(p.name for p in (model_dir / "1").iterdir()) == ["model.onnx"]
    python = render(RepositorySettings(profile="cpu"), exported_stub, tmp_path / "py")
    assert (python / TRITON_MODEL_NAME / "1" / "model.py").exists()


@pytest.mark.parametrize("profile", ["cuda", "tensorrt"])
def test_cudnn_search_is_where_the_backend_reads_it(profile: str) -> None:
    """The r25.01 onnxruntime backend reads cudnn_conv_algo_search from the top-level
    parameters (0 EXHAUSTIVE, 1 HEURISTIC) and, when that block exists without it, forces
    EXHAUSTIVE over whatever the accelerator says; the block always exists (the canary)."""
    config = parse(render_config(RepositorySettings(profile=profile), 224, 512))
    assert config.parameters["cudnn_conv_algo_search"].string_value == "1"
    for accel in config.optimization.execution_accelerators.gpu_execution_accelerator:
        assert "cudnn_conv_algo_search" not in accel.parameters


def test_cuda_graphs_are_refused_with_dynamic_batching() -> None:
    with pytest.raises(ValueError, match="cuda_graph is refused"):
        RepositorySettings(profile="cuda", cuda_graph=True)
    for profile in ("cuda", "tensorrt"):
        config = parse(render_config(RepositorySettings(profile=profile), 224, 512))
        assert config.HasField("dynamic_batching")
        (accel,) = config.optimization.execution_accelerators.gpu_execution_accelerator
        graphs = {k: v for k, v in accel.parameters.items() if "cuda_graph" in k}
        assert graphs and set(graphs.values()) == {"0"}


def test_cuda_profile_uses_fp16_graph_and_cuda_ep() -> None:
    config = parse(render_config(RepositorySettings(profile="cuda"), 224, 512))
    assert config.backend == "onnxruntime"
    assert config.default_model_filename == "model_fp16.onnx"
    assert config.instance_group[0].kind == mc.ModelInstanceGroup.KIND_GPU
    (accel,) = config.optimization.execution_accelerators.gpu_execution_accelerator
    assert accel.name == "cuda"
    fp32 = parse(render_config(RepositorySettings(profile="cuda", cuda_precision="fp32"), 224, 512))
    assert fp32.default_model_filename == "model.onnx"


def test_cuda_profile_on_the_python_backend_runs_the_fp16_graph_on_the_cuda_ep(
    exported_stub: Path, tmp_path: Path
) -> None:
    """A Triton with only the Python backend (the PyPI one, docs/GPU_HOST.md): the same FP16
    file, KIND_GPU instances, the native backend's CUDA EP options as the model's parameters."""
    settings = RepositorySettings(profile="cuda", gpu_backend="python", instance_count=2)
    config = parse(render_config(settings, 224, 512))
    assert config.backend == "python"
    assert [(g.kind, g.count) for g in config.instance_group] == [
        (mc.ModelInstanceGroup.KIND_GPU, 2)
    ]
    assert config.parameters["onnx_file"].string_value == "model_fp16.onnx"
    assert config.parameters["execution_provider"].string_value == "cuda"
    assert config.parameters["cudnn_conv_algo_search"].string_value == "HEURISTIC"
    assert config.parameters["enable_cuda_graph"].string_value == "0"
    # waits for the GPU asleep, idle ORT threads not spinning: the host's cores decode
    assert config.parameters["cuda_blocking_sync"].string_value == "1"
    assert config.parameters["allow_spinning"].string_value == "0"
    spinning = settings.model_copy(update={"cuda_blocking_sync": False})
    assert parse(render_config(spinning, 224, 512)).parameters[
        "cuda_blocking_sync"].string_value == "0"  # fmt: skip
    assert not config.optimization.execution_accelerators.gpu_execution_accelerator
    assert [w.batch_size for w in config.model_warmup] == [1, 4, 8, 16, 32]  # a GPU profile's
    model_dir = render(settings, exported_stub, tmp_path / "repo") / TRITON_MODEL_NAME
    assert sorted(p.name for p in (model_dir / "1").iterdir()) == ["model.py", "model_fp16.onnx"]
    native = render(RepositorySettings(profile="cuda"), exported_stub, tmp_path / "native")
    assert not (native / TRITON_MODEL_NAME / "1" / "model.py").exists()


def test_tensorrt_profile_covers_every_batch_with_one_profile_and_warms_it() -> None:
    settings = RepositorySettings(profile="tensorrt", trt_cache_path="/engines", max_batch_size=32)
    config = parse(render_config(settings, 224, 512))
    (accel,) = config.optimization.execution_accelerators.gpu_execution_accelerator
    params = dict(accel.parameters)
    assert accel.name == "tensorrt"
    assert set(params) <= ORT_BACKEND_TRT_KEYS
    assert params["precision_mode"] == "FP16"
    assert params["trt_engine_cache_enable"] == "1"
    assert params["trt_engine_cache_path"] == "/engines"
    assert params["trt_profile_min_shapes"] == f"{INPUT_NAME}:1x224x224x3"
    assert params["trt_profile_max_shapes"] == f"{INPUT_NAME}:32x224x224x3"
    assert params["trt_profile_opt_shapes"] == f"{INPUT_NAME}:32x224x224x3"
    warm = [w.batch_size for w in config.model_warmup]
    assert warm == [1, 4, 8, 16, 32]
    for warmup in config.model_warmup:
        tensor = warmup.inputs[INPUT_NAME]
        assert (tensor.data_type, list(tensor.dims)) == (mc.TYPE_UINT8, [224, 224, 3])


def test_warmup_sizes_above_max_are_refused() -> None:
    with pytest.raises(ValueError, match="exceed max_batch_size"):
        RepositorySettings(max_batch_size=8, warmup_batch_sizes=(1, 16))


def test_env_configures_the_repository(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_TRITON_PROFILE", "tensorrt")
    monkeypatch.setenv("GATEWAY_TRITON_MAX_QUEUE_DELAY_US", "10000")
    monkeypatch.setenv("GATEWAY_TRITON_PREFERRED_BATCH_SIZES", "[8, 16]")
    settings = RepositorySettings()
    assert (settings.profile, settings.max_queue_delay_us, settings.preferred) == (
        "tensorrt",
        10000,
        (8, 16),
    )


def test_templates_have_no_unrendered_placeholders(tmp_path: Path) -> None:
    for profile in PROFILES:
        settings = RepositorySettings(profile=profile)
        for config in (render_config(settings, 224, 512), render_text_config(settings, 77, 512)):
            text = text_format.MessageToString(config)
            assert "${" not in text and "$" not in text.replace("$$", "")


@pytest.mark.parametrize("profile", PROFILES)
def test_text_model_has_its_own_tensor_contract_and_the_same_batching(profile: str) -> None:
    settings = RepositorySettings(profile=profile)
    config = parse(render_text_config(settings, 77, 512))
    image = parse(render_config(settings, 224, 512))
    assert config.name == TEXT_MODEL_NAME
    (inp,) = config.input
    assert (inp.name, inp.data_type, list(inp.dims)) == (TEXT_INPUT_NAME, mc.TYPE_INT32, [77])
    assert inp.format == mc.ModelInput.FORMAT_NONE
    (out,) = config.output
    assert (out.name, out.data_type, list(out.dims)) == (TEXT_OUTPUT_NAME, mc.TYPE_FP32, [512])
    assert config.parameters["context_length"].string_value == "77"
    assert config.max_batch_size == image.max_batch_size
    assert config.dynamic_batching == image.dynamic_batching
    assert config.backend == image.backend and config.instance_group == image.instance_group
    for warmup in config.model_warmup:  # ids must be in the vocabulary: zeros, never random
        tensor = warmup.inputs[TEXT_INPUT_NAME]
        assert (tensor.data_type, list(tensor.dims), tensor.zero_data) == (
            mc.TYPE_INT32,
            [77],
            True,
        )
    assert [w.batch_size for w in config.model_warmup] == [w.batch_size for w in image.model_warmup]


def test_text_model_files_per_profile() -> None:
    cpu = parse(render_text_config(RepositorySettings(profile="cpu"), 77, 512))
    assert cpu.parameters["onnx_file"].string_value == "text.onnx"
    cuda = parse(render_text_config(RepositorySettings(profile="cuda"), 77, 512))
    assert cuda.default_model_filename == "text_fp16.onnx"
    settings = RepositorySettings(profile="cuda", cuda_precision="fp32")
    assert parse(render_text_config(settings, 77, 512)).default_model_filename == "text.onnx"
    trt = parse(render_text_config(RepositorySettings(profile="tensorrt"), 77, 512))
    assert trt.default_model_filename == "text.onnx"


def test_tensorrt_text_profile_spans_every_batch_of_token_rows() -> None:
    settings = RepositorySettings(profile="tensorrt", max_batch_size=64)
    config = parse(render_text_config(settings, 77, 512))
    (accel,) = config.optimization.execution_accelerators.gpu_execution_accelerator
    params = dict(accel.parameters)
    assert set(params) <= ORT_BACKEND_TRT_KEYS
    assert params["trt_profile_min_shapes"] == f"{TEXT_INPUT_NAME}:1x77"
    assert params["trt_profile_opt_shapes"] == f"{TEXT_INPUT_NAME}:32x77"
    assert params["trt_profile_max_shapes"] == f"{TEXT_INPUT_NAME}:64x77"


def fake_export(directory: Path, tokenizer: dict[str, object], towers: bool = True) -> Path:
    """An export directory as `python -m clip_gateway.export` lays it out (empty ONNX files: only
    rendered)."""
    directory.mkdir()
    for name in ("model.onnx", "model_fp16.onnx", "text.onnx", "text_fp16.onnx", "tokenizer.json"):
        (directory / name).write_bytes(b"")
    manifest = {"image_size": 256, "embed_dim": 768, "canary_embedding": "AAAA"}
    if towers:
        manifest |= {
            "context_length": 64,
            "preprocess": {"size": 256, "resize_mode": "squash", "center_crop": False},
            "towers": {"image": {}, "text": {"canary_embedding": "BBBB"}},
            "tokenizer": tokenizer,
        }
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return directory


def read(repo: Path, model: str) -> mc.ModelConfig:
    return text_format.Parse((repo / model / "config.pbtxt").read_text(), mc.ModelConfig())


@pytest.mark.parametrize("link", [True, False])
def test_render_places_the_tokenizer_beside_clip_text_and_names_it(
    tmp_path: Path, link: bool
) -> None:
    export = fake_export(tmp_path / "export", {"kind": "clip_bpe", "available": True,
                                               "file": "tokenizer.json"})  # fmt: skip
    repo = render(RepositorySettings(profile="cpu"), export, tmp_path / "repo", link=link)
    image, text = read(repo, TRITON_MODEL_NAME), read(repo, TEXT_MODEL_NAME)
    assert (
        json.loads(image.parameters[PREPROCESS_PARAMETER].string_value)["resize_mode"] == "squash"
    )
    assert image.parameters[CANARY_PARAMETER].string_value == "AAAA"
    assert list(text.input[0].dims) == [64] and list(text.output[0].dims) == [768]
    assert text.parameters["tokenizer"].string_value == "clip_bpe"
    placed = Path(text.parameters["tokenizer_file"].string_value)
    assert placed == (repo / TEXT_MODEL_NAME / "tokenizer.json").absolute()
    assert placed.is_symlink() == link and placed.resolve().exists()
    assert "text_unavailable_reason" not in text.parameters
    assert text.parameters[CANARY_PARAMETER].string_value == "BBBB"
    assert (repo / TEXT_MODEL_NAME / "1" / "text.onnx").exists()


def test_render_passes_a_hf_tokenizers_framing_to_the_gateway(tmp_path: Path) -> None:
    """SigLIP's: open_clip's cleaning, the separator strip and the graph's pooling, read back by
    the gateway's parser (backend/model_config.py) into the text model it tokenises for."""
    from clip_gateway.backend.model_config import parse_text_config
    from clip_gateway.backend.protocol import ModelInfo

    tokenizer = {"kind": "hf", "available": True, "file": "tokenizer.json",
                 "clean": "canonicalize", "strip_sep_id": 2, "pooling": "last",
                 "pad_id": 1}  # fmt: skip
    repo = render(RepositorySettings(profile="cpu"), fake_export(tmp_path / "e", tokenizer),
                  tmp_path / "repo")  # fmt: skip
    text = read(repo, TEXT_MODEL_NAME)
    assert text.parameters["tokenizer"].string_value == "hf"
    options = json.loads(text.parameters["tokenizer_options"].string_value)
    assert options == {"clean": "canonicalize", "strip_sep_id": 2, "pooling": "last"}
    config = json.loads(json_format.MessageToJson(text, preserving_proto_field_name=True))
    config["parameters"].pop(CANARY_PARAMETER)  # the fake export's is not a vector
    info = parse_text_config(ModelInfo("clip_image", 256, 768, 8), config)
    assert info.text is not None and info.text_unavailable is None
    assert (info.text.tokenizer_kind, info.text.clean, info.text.strip_sep_id) == (
        "hf", "canonicalize", 2,
    )  # fmt: skip
    assert (info.text.pooling, info.text.context_length) == ("last", 64)


def test_render_says_why_text_is_unavailable(tmp_path: Path) -> None:
    reason = "M uses the Hugging Face tokenizer 'x'; so this model serves images only"
    tokenizer = {"kind": "hf", "available": False, "reason": reason}
    repo = render(RepositorySettings(profile="cuda"), fake_export(tmp_path / "e", tokenizer),
                  tmp_path / "repo")  # fmt: skip
    # no text model for Triton to load (and build engines for) in vain: the image model says why
    assert sorted(p.name for p in repo.iterdir()) == [TRITON_MODEL_NAME]
    image = read(repo, TRITON_MODEL_NAME)
    assert image.parameters["text_unavailable_reason"].string_value == reason


def test_an_export_from_before_the_text_tower_renders_the_image_model_only(tmp_path: Path) -> None:
    repo = render(RepositorySettings(profile="cpu"), fake_export(tmp_path / "e", {}, towers=False),
                  tmp_path / "repo")  # fmt: skip
    assert sorted(p.name for p in repo.iterdir()) == [TRITON_MODEL_NAME]
    assert PREPROCESS_PARAMETER not in read(repo, TRITON_MODEL_NAME).parameters


INT8_SECTION = {
    "method": "dynamic",
    "weights": "int8, per output channel",
    "files": {"image": "model_int8.onnx", "text": "text_int8.onnx"},
    "figures": {
        "image": {"set": "photos", "vs_fp32": {"mean": 0.9998, "min": 0.9997, "count": 48}},
        "text": {"set": "captions", "vs_fp32": {"mean": 0.9993, "min": 0.999, "count": 96}},
    },
    "thresholds": {"min_mean_cosine": 0.998, "min_cosine": 0.99},
    "canary_embedding": {"image": "AABAQA==", "text": "AACAQA=="},  # 3.0, 4.0 (float32 LE)
}


def int8_export(directory: Path) -> Path:
    export = fake_export(directory, {"kind": "clip_bpe", "available": True,
                                     "file": "tokenizer.json"})  # fmt: skip
    for name in ("model_int8.onnx", "text_int8.onnx"):
        (export / name).write_bytes(b"")
    manifest = json.loads((export / "manifest.json").read_text())
    # complete enough for the gateway to read back (parse_model_config)
    manifest["preprocess"] |= {"interpolation": "bicubic", "mean": [0.5] * 3, "std": [0.5] * 3}
    manifest["canary_embedding"] = "AACAPw=="  # FP32's: 1.0
    manifest["towers"]["text"]["canary_embedding"] = "AAAAQA=="  # 2.0
    (export / "manifest.json").write_text(json.dumps(manifest | {"int8": INT8_SECTION}))
    return export


def quantization(config: mc.ModelConfig) -> dict[str, object]:
    value: dict[str, object] = json.loads(config.parameters[QUANTIZATION_PARAMETER].string_value)
    return value


def test_cpu_int8_renders_both_towers_int8_files_with_their_figures_and_canaries(
    tmp_path: Path,
) -> None:
    repo = render(RepositorySettings(profile="cpu-int8"), int8_export(tmp_path / "e"),
                  tmp_path / "repo")  # fmt: skip
    for model, kind, onnx_file, canary in (
        (TRITON_MODEL_NAME, "image", "model_int8.onnx", "AABAQA=="),
        (TEXT_MODEL_NAME, "text", "text_int8.onnx", "AACAQA=="),
    ):
        config = read(repo, model)
        assert config.backend == "python"  # the cpu profile's Python backend, unchanged
        assert config.parameters["onnx_file"].string_value == onnx_file
        assert (repo / model / "1" / onnx_file).exists()
        assert (repo / model / "1" / "model.py").exists()
        # the INT8 graph's own export-time output: the canary checks what is served
        assert config.parameters[CANARY_PARAMETER].string_value == canary
        value = quantization(config)
        assert value["precision"] == "int8" and value["method"] == "dynamic"
        figures = INT8_SECTION["figures"][kind]  # type: ignore[index]
        assert value["cosine_vs_fp32"] == figures["vs_fp32"]
        assert value["gate"] == INT8_SECTION["thresholds"]


def test_cpu_int8_falls_back_to_the_fp32_files_saying_why(tmp_path: Path) -> None:
    why = "INT8 refused by the quality gate: image tower cosine vs FP32 min 0.98 < 0.99"
    repo = render(RepositorySettings(profile="cpu-int8"), int8_export(tmp_path / "e"),
                  tmp_path / "repo", int8_fallback=why)  # fmt: skip
    image, text = read(repo, TRITON_MODEL_NAME), read(repo, TEXT_MODEL_NAME)
    assert image.parameters["onnx_file"].string_value == "model.onnx"
    assert text.parameters["onnx_file"].string_value == "text.onnx"
    assert image.parameters[CANARY_PARAMETER].string_value == "AACAPw=="  # FP32's reference
    assert text.parameters[CANARY_PARAMETER].string_value == "AAAAQA=="
    for config in (image, text):
        value = quantization(config)
        assert (value["precision"], value["requested"], value["fallback"]) == ("fp32", "int8", why)


def test_the_fp32_cpu_profile_renders_no_quantization(tmp_path: Path) -> None:
    repo = render(RepositorySettings(profile="cpu"), int8_export(tmp_path / "e"), tmp_path / "r")
    for model in (TRITON_MODEL_NAME, TEXT_MODEL_NAME):
        config = read(repo, model)
        assert QUANTIZATION_PARAMETER not in config.parameters
        assert not config.parameters["onnx_file"].string_value.endswith("_int8.onnx")


def test_cpu_int8_without_int8_files_says_how_to_make_them(tmp_path: Path) -> None:
    export = fake_export(tmp_path / "e", {"kind": "clip_bpe", "available": True,
                                          "file": "tokenizer.json"})  # fmt: skip
    with pytest.raises(FileNotFoundError, match="export with --int8"):
        render(RepositorySettings(profile="cpu-int8"), export, tmp_path / "repo")


def as_triton_json(config: mc.ModelConfig) -> dict[str, object]:
    """The config as Triton's get_model_config(as_json=True) hands it to the gateway."""
    from google.protobuf.json_format import MessageToDict

    return MessageToDict(config, preserving_proto_field_name=True)


def test_the_gateway_reads_each_towers_quantization_from_the_rendered_configs(
    tmp_path: Path,
) -> None:
    from clip_gateway.backend.model_config import parse_model_config, parse_text_config

    repo = render(RepositorySettings(profile="cpu-int8"), int8_export(tmp_path / "e"),
                  tmp_path / "repo")  # fmt: skip
    info = parse_model_config(as_triton_json(read(repo, TRITON_MODEL_NAME)))
    assert info.quantization is not None and set(info.quantization) == {"image"}
    assert info.canary is not None and info.canary.tolist() == [3.0]  # the INT8 graph's
    info = parse_text_config(info, as_triton_json(read(repo, TEXT_MODEL_NAME)))
    assert info.quantization is not None
    assert info.quantization["image"]["cosine_vs_fp32"]["mean"] == 0.9998
    assert info.quantization["text"]["cosine_vs_fp32"]["min"] == 0.999
    plain = render(RepositorySettings(profile="cpu"), int8_export(tmp_path / "p"), tmp_path / "r")
    assert parse_model_config(as_triton_json(read(plain, TRITON_MODEL_NAME))).quantization is None


def test_an_unreadable_quantization_parameter_is_a_backend_failure(tmp_path: Path) -> None:
    from clip_gateway.backend.model_config import parse_model_config
    from clip_gateway.errors import BackendFailed

    repo = render(RepositorySettings(profile="cpu-int8"), int8_export(tmp_path / "e"),
                  tmp_path / "repo")  # fmt: skip
    config = read(repo, TRITON_MODEL_NAME)
    config.parameters[QUANTIZATION_PARAMETER].string_value = "{not json"
    with pytest.raises(BackendFailed, match="quantization parameter"):
        parse_model_config(as_triton_json(config))


def test_tensorrt_serves_a_graph_its_parser_cannot_take_whole_on_the_cuda_ep(
    tmp_path: Path,
) -> None:
    """The text tower's pooling is outside onnx-tensorrt's table (recorded at export): rather
    than a TensorRT/CUDA split nobody measured, clip_text runs on the CUDA EP and says why;
    the image tower, which TensorRT takes whole, keeps its engine."""
    export = fake_export(tmp_path / "export", {"kind": "clip_bpe", "available": True,
                                               "file": "tokenizer.json"})  # fmt: skip
    manifest = json.loads((export / "manifest.json").read_text())
    pooling = "ArgMax (node_argmax) is not in TensorRT's supported ops"
    # the FP16 files are the CUDA EP's, fused with ONNX Runtime's contrib ops: TensorRT reads
    # the FP32 graph, so the image tower keeps its engine whatever its FP16 file holds
    fused = "SkipLayerNormalization (n1) is not in TensorRT's supported ops"
    blockers = {"model.onnx": [], "model_fp16.onnx": [fused], "text.onnx": [pooling],
                "text_fp16.onnx": [pooling, fused]}  # fmt: skip
    manifest["tensorrt_blockers"] = blockers
    (export / "manifest.json").write_text(json.dumps(manifest))
    settings = RepositorySettings(profile="tensorrt", trt_cache_path="/engines")
    repo = render(settings, export, tmp_path / "repo")
    image, text = read(repo, TRITON_MODEL_NAME), read(repo, TEXT_MODEL_NAME)
    (image_accel,) = image.optimization.execution_accelerators.gpu_execution_accelerator
    assert image_accel.name == "tensorrt" and "tensorrt_blockers" not in image.parameters
    assert [a.name for a in text.optimization.execution_accelerators.gpu_execution_accelerator] \
        != ["tensorrt"]  # fmt: skip
    assert text.parameters["tensorrt_blockers"].string_value == f"served on the CUDA EP: {pooling}"
    assert (repo / TEXT_MODEL_NAME / "1" / "text_fp16.onnx").exists()  # the cuda profile's file
    cuda = read(render(RepositorySettings(profile="cuda"), export, tmp_path / "cuda"),
                TEXT_MODEL_NAME)  # fmt: skip
    assert text.optimization == cuda.optimization


@pytest.mark.parametrize(("count", "instances"), [(0, 1), (1, 1), (2, 2), (3, 3)])
def test_the_gateway_reads_how_many_instances_serve_each_tower(
    tmp_path: Path, count: int, instances: int
) -> None:
    """What the service splits a request by: the rendered instance count (0 renders 1)."""
    from clip_gateway.backend.model_config import parse_model_config, parse_text_config

    settings = RepositorySettings(profile="cpu", instance_count=count)
    repo = render(settings, int8_export(tmp_path / "export"), tmp_path / "repo")
    info = parse_model_config(as_triton_json(read(repo, TRITON_MODEL_NAME)))
    info = parse_text_config(info, as_triton_json(read(repo, TEXT_MODEL_NAME)))
    assert info.instances == instances
    assert info.text is not None and info.text.instances == instances


def test_auto_is_resolved_before_rendering(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The launcher resolves `auto` and renders with a concrete profile; rendering `auto`
    is refused rather than guessed."""
    monkeypatch.setenv("GATEWAY_TRITON_PROFILE", "auto")
    chosen = RepositorySettings().model_copy(update={"profile": "tensorrt"})
    assert render_config(chosen, 224, 512).backend == "onnxruntime"
    with pytest.raises(ValueError, match="auto"):
        render_config(RepositorySettings(), 224, 512)
