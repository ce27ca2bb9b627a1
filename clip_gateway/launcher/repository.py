"""Render Triton's model repository for one profile from triton/ templates plus settings: the
image tower (``clip_image``) and, for exports that have one, the text tower (``clip_text``)."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from clip_gateway.config.settings import CPU_PROFILES, RepositorySettings
from clip_gateway.model.contract import (
    CANARY_PARAMETER,
    CONTEXT_LENGTH_PARAMETER,
    INPUT_NAME,
    OUTPUT_NAME,
    PREPROCESS_PARAMETER,
    QUANTIZATION_PARAMETER,
    TENSORRT_BLOCKERS_PARAMETER,
    TEXT_INPUT_NAME,
    TEXT_MODEL_NAME,
    TEXT_OUTPUT_NAME,
    TEXT_UNAVAILABLE_PARAMETER,
    TOKENIZER_FILE_PARAMETER,
    TOKENIZER_OPTIONS_PARAMETER,
    TOKENIZER_PARAMETER,
    TRITON_MODEL_NAME,
)
from clip_gateway.profiles import int8_openvino

#: triton/python/model.py's parameters: which runtime runs the ONNX file, at which precision.
RUNTIME_PARAMETER = "runtime"
PRECISION_PARAMETER = "inference_precision"

#: The exporter's tokenizer file (model/spec.py TOKENIZER_FILE), placed beside clip_text's config.
TOKENIZER_FILE = "tokenizer.json"


@dataclass(frozen=True)
class Tower:
    """One model's tensor contract and ONNX files, as the templates need them."""

    model_name: str
    input_name: str
    input_type: int  # mc.TYPE_*
    input_format: str
    dims: tuple[int, ...]
    output_name: str
    embed_dim: int
    fp32_file: str
    fp16_file: str
    int8_file: str
    #: OpenVINO IR quantized by NNCF (``cpu-int8-openvino``), beside the export with its .bin
    int8_openvino_file: str
    #: How warm-up requests are filled: pixels can be anything, token ids must be in the vocabulary.
    warmup_fill: str


def image_tower(image_size: int, embed_dim: int) -> Tower:
    return Tower(TRITON_MODEL_NAME, INPUT_NAME, mc.TYPE_UINT8, "FORMAT_NHWC",
                 (image_size, image_size, 3), OUTPUT_NAME, embed_dim,
                 "model.onnx", "model_fp16.onnx", "model_int8.onnx",
                 int8_openvino.FILES["image"], "random_data")  # fmt: skip


def text_tower(context_length: int, embed_dim: int) -> Tower:
    return Tower(TEXT_MODEL_NAME, TEXT_INPUT_NAME, mc.TYPE_INT32, "FORMAT_NONE",
                 (context_length,), TEXT_OUTPUT_NAME, embed_dim,
                 "text.onnx", "text_fp16.onnx", "text_int8.onnx",
                 int8_openvino.FILES["text"], "zero_data")  # fmt: skip


def default_templates() -> Path:
    """``triton/`` of the source checkout, or the copy a wheel carries inside the package."""
    package = Path(__file__).resolve().parents[1]
    checkout = package.parent / "triton"
    return checkout if checkout.is_dir() else package / "_triton"


def render_config(
    settings: RepositorySettings,
    image_size: int,
    embed_dim: int,
    templates: Path | None = None,
) -> mc.ModelConfig:
    """``clip_image``'s config (tensor contract, batching, profile); no export needed."""
    return render_tower_config(settings, image_tower(image_size, embed_dim), templates)


def render_text_config(
    settings: RepositorySettings,
    context_length: int,
    embed_dim: int,
    templates: Path | None = None,
    rest: str = "f32",
) -> mc.ModelConfig:
    """``clip_text``'s config: the same batching and profile, int32 token ids in."""
    config = render_tower_config(settings, text_tower(context_length, embed_dim), templates, rest)
    config.parameters[CONTEXT_LENGTH_PARAMETER].string_value = str(context_length)
    return config


def render_tower_config(
    settings: RepositorySettings, tower: Tower, templates: Path | None = None, rest: str = "f32"
) -> mc.ModelConfig:
    """One tower's config; ``rest``: ``cpu-int8-openvino``'s precision for the operations NNCF
    left unquantized (its build record's)."""
    if settings.profile == "auto":
        raise ValueError("profile 'auto' must be resolved (profiles/choice.py) before rendering")
    templates = templates or settings.templates_dir or default_templates()
    values = {
        "model_name": tower.model_name,
        "input_name": tower.input_name,
        "input_type": mc.DataType.Name(tower.input_type),
        "input_format": tower.input_format,
        "input_dims": ", ".join(map(str, tower.dims)),
        "input_shape": "x".join(map(str, tower.dims)),
        "output_name": tower.output_name,
        "embed_dim": tower.embed_dim,
        "max_batch_size": settings.max_batch_size,
        "preferred_batch_sizes": ", ".join(map(str, settings.preferred)),
        "max_queue_delay_us": settings.max_queue_delay_us,
        "queue_timeout_us": settings.queue_timeout_us,
        "max_queue_size": settings.max_queue_size,
        "instance_count": settings.instance_count or 1,  # the launcher plans CPU instances
        "cpu_threads": settings.cpu_threads,
        "cpu_spinning": int(settings.cpu_spinning),
        "onnx_file": _onnx_file(settings, tower),
        "cuda_graph": int(settings.cuda_graph),
        "cuda_blocking_sync": int(settings.cuda_blocking_sync),
        "trt_cache_path": settings.trt_cache_path,
        "trt_workspace_bytes": settings.trt_workspace_bytes,
        "trt_opt_batch": max(settings.preferred),
    }
    config = mc.ModelConfig()
    for part in ("base.pbtxt", f"profiles/{_profile_template(settings)}.pbtxt"):
        text = Template((templates / part).read_text()).substitute(values)
        text_format.Merge(text, config)
    if settings.profile in ("cpu-bf16", "cpu-int8-openvino"):
        if settings.cpu_backend != "python":
            raise ValueError(f"the {settings.profile} profile runs OpenVINO in the Python "
                             "backend: GATEWAY_TRITON_CPU_BACKEND must be python")  # fmt: skip
        config.parameters[RUNTIME_PARAMETER].string_value = "openvino"
        config.parameters[PRECISION_PARAMETER].string_value = (
            "bf16" if settings.profile == "cpu-bf16" else rest
        )
    for batch in settings.warmup:
        warmup = config.model_warmup.add(name=f"batch_{batch}", batch_size=batch, count=1)
        tensor = warmup.inputs[tower.input_name]
        tensor.data_type = tower.input_type
        tensor.dims.extend(tower.dims)
        setattr(tensor, tower.warmup_fill, True)
    return config


def _profile_template(settings: RepositorySettings) -> str:
    if settings.profile in CPU_PROFILES:
        return "cpu_onnxruntime" if settings.cpu_backend == "onnxruntime" else "cpu"
    if settings.profile == "cuda" and settings.gpu_backend == "python":
        return "cuda_python"
    return settings.profile


def _python_backend(settings: RepositorySettings) -> bool:
    """Whether triton/python/model.py runs the ONNX file (else one of Triton's own backends)."""
    return _profile_template(settings) in ("cpu", "cuda_python")


def _onnx_file(settings: RepositorySettings, tower: Tower) -> str:
    if settings.profile == "cuda" and settings.cuda_precision == "fp16":
        return tower.fp16_file
    if settings.profile == "cpu-int8":
        return tower.int8_file
    if settings.profile == "cpu-int8-openvino":
        return tower.int8_openvino_file
    return tower.fp32_file


def render(
    settings: RepositorySettings,
    export_dir: Path,
    out_dir: Path,
    templates: Path | None = None,
    *,
    link: bool = True,
    int8_fallback: str | None = None,
    bf16: dict[str, Any] | None = None,
    profile_choice: dict[str, Any] | None = None,
    core_plan: dict[str, Any] | None = None,
    gate: dict[str, float] | None = None,
) -> Path:
    """Write ``out_dir/<model>/{config.pbtxt,1/...}`` for ``settings.profile``; return ``out_dir``.

    ``export_dir`` is a directory written by ``python -m clip_gateway.export``. Large files are
    symlinked (``link=True``) or copied (for images and volumes that must not point elsewhere).
    Exports made before the text tower existed render ``clip_image`` only, and so do exports whose
    tokenizer the gateway cannot reproduce (``clip_image`` then carries the reason).

    ``cpu-int8`` renders the INT8 files (the launcher has held their figures to the quality
    gate), each config with its tower's figures and INT8 canary; with ``int8_fallback`` (why
    INT8 is not served) the FP32 files instead, the configs saying so.

    ``cpu-bf16`` renders the FP32 files for OpenVINO at BF16; ``bf16`` is what the launcher's
    gate measured (profiles/bf16.py ``section``), shown per tower in /v1/models; with its
    ``fallback`` set (why BF16 is not served) the ``cpu`` profile instead, the configs saying so.

    ``cpu-int8-openvino`` renders the OpenVINO IR its build kept beside the export
    (profiles/int8_openvino.py), at the precision it was built for, each config with its
    tower's figures and ``gate``, the thresholds the launcher held them to.

    ``profile_choice``: what ``auto`` measured on this CPU and chose (profiles/cpu_auto.py),
    and ``core_plan``: the CPU profile's model plan and what it was chosen by
    (profiles/planner.py), added to each tower's quantization parameter for /v1/models.
    """
    _render(settings, export_dir, out_dir, templates, link=link, int8_fallback=int8_fallback,
            bf16=bf16, gate=gate)  # fmt: skip
    notes = {"profile_choice": profile_choice, "core_plan": core_plan}
    if notes := {key: value for key, value in notes.items() if value is not None}:
        _note(out_dir, notes)
    return out_dir


def _note(out_dir: Path, notes: dict[str, Any]) -> None:
    for model_name in (TRITON_MODEL_NAME, TEXT_MODEL_NAME):
        path = out_dir / model_name / "config.pbtxt"
        if not path.exists():
            continue
        config = text_format.Parse(path.read_text(), mc.ModelConfig())
        known = config.parameters[QUANTIZATION_PARAMETER].string_value
        value = json.loads(known) if known else {"precision": "fp32"}
        config.parameters[QUANTIZATION_PARAMETER].string_value = json.dumps(value | notes)
        path.write_text(text_format.MessageToString(config))


def _render(
    settings: RepositorySettings,
    export_dir: Path,
    out_dir: Path,
    templates: Path | None,
    *,
    link: bool,
    int8_fallback: str | None,
    bf16: dict[str, Any] | None,
    gate: dict[str, float] | None,
) -> Path:
    templates = templates or settings.templates_dir or default_templates()
    manifest = json.loads((export_dir / "manifest.json").read_text())
    built: dict[str, Any] = {}
    if settings.profile == "cpu-int8-openvino":
        built = int8_openvino.kept(export_dir) or {}
        if not built:
            raise FileNotFoundError(f"{export_dir} has no OpenVINO INT8 build: the launcher "
                                    "builds it at a cpu-int8-openvino start")  # fmt: skip
    rest = str(built.get("rest", "f32"))
    if settings.profile == "cpu-bf16" and bf16 is not None and bf16.get("fallback"):
        served = settings.model_copy(update={"profile": "cpu"})
        render(served, export_dir, out_dir, templates, link=link)
        _precision(out_dir, bf16)
        return out_dir
    if settings.profile == "cpu-int8" and int8_fallback is not None:
        served = settings.model_copy(update={"profile": "cpu"})
        render(served, export_dir, out_dir, templates, link=link)
        _quantization(out_dir, manifest, int8_fallback)
        return out_dir
    image = image_tower(manifest["image_size"], manifest["embed_dim"])
    image_settings = _tower_settings(settings, manifest, image)
    config = render_tower_config(image_settings, image, templates, rest)
    _note_blockers(config, settings, manifest, image)
    if canary := manifest.get("canary_embedding"):
        config.parameters[CANARY_PARAMETER].string_value = canary
    if preprocess := manifest.get("preprocess"):
        config.parameters[PREPROCESS_PARAMETER].string_value = json.dumps(preprocess)
    model_dir = _model_dir(image_settings, image, export_dir, out_dir, templates, link)
    tokenizer = manifest.get("tokenizer", {})
    if "text" in manifest.get("towers", {}) and not tokenizer.get("available"):
        # no tower Triton would load for nothing (a SigLIP text tower is 442 MB, and a TensorRT
        # engine to build): clip_image says why text cannot be served
        config.parameters[TEXT_UNAVAILABLE_PARAMETER].string_value = tokenizer["reason"]
    (model_dir / "config.pbtxt").write_text(text_format.MessageToString(config))
    if "text" in manifest.get("towers", {}) and tokenizer.get("available"):
        text = text_tower(manifest["context_length"], manifest["embed_dim"])
        text_settings = _tower_settings(settings, manifest, text)
        config = render_text_config(text_settings, text.dims[0], text.embed_dim, templates, rest)
        _note_blockers(config, settings, manifest, text)
        model_dir = _model_dir(text_settings, text, export_dir, out_dir, templates, link)
        _text_parameters(config, manifest, export_dir, model_dir, link)
        (model_dir / "config.pbtxt").write_text(text_format.MessageToString(config))
    if settings.profile == "cpu-int8":
        _quantization(out_dir, manifest, None)
    if settings.profile == "cpu-bf16":
        _precision(out_dir, bf16 or {})
    if settings.profile == "cpu-int8-openvino":
        _openvino_int8(out_dir, built, gate)
    return out_dir


def _openvino_int8(out_dir: Path, built: dict[str, Any], gate: dict[str, float] | None) -> None:
    for model_name, kind in ((TRITON_MODEL_NAME, "image"), (TEXT_MODEL_NAME, "text")):
        path = out_dir / model_name / "config.pbtxt"
        if not path.exists():
            continue
        config = text_format.Parse(path.read_text(), mc.ModelConfig())
        value = int8_openvino.quantization(built, kind, gate)
        config.parameters[QUANTIZATION_PARAMETER].string_value = json.dumps(value)
        path.write_text(text_format.MessageToString(config))


def _precision(out_dir: Path, bf16: dict[str, Any]) -> None:
    """``cpu-bf16``'s entry in each tower's quantization parameter (/v1/models): the runtime and
    precision that serve, the gate's figures for the tower, or why FP32 serves instead."""
    for model_name, kind in ((TRITON_MODEL_NAME, "image"), (TEXT_MODEL_NAME, "text")):
        path = out_dir / model_name / "config.pbtxt"
        if not path.exists():
            continue
        config = text_format.Parse(path.read_text(), mc.ModelConfig())
        value: dict[str, Any]
        if fallback := bf16.get("fallback"):
            value = {"precision": "fp32", "runtime": "onnxruntime", "requested": "bf16",
                     "fallback": fallback}  # fmt: skip
        else:
            value = {"precision": "bf16", "runtime": "openvino"}
        if version := bf16.get("openvino"):
            value["openvino"] = version
        if figures := (bf16.get("figures") or {}).get(kind):
            value |= {
                "calibration_set": figures.get("set"),
                "cosine_vs_fp32": figures.get("vs_fp32"),
                "gate": bf16.get("thresholds"),
            }
        config.parameters[QUANTIZATION_PARAMETER].string_value = json.dumps(value)
        path.write_text(text_format.MessageToString(config))


def _blockers(manifest: dict[str, Any], tower: Tower) -> list[str]:
    """What TensorRT's ONNX parser would reject in the graph the ``tensorrt`` profile loads: the
    FP32 one (clip_gateway/export/graph.py, recorded in the manifest at export). TensorRT builds its
    FP16 engine from it; the FP16 file is the CUDA EP's, with ONNX Runtime's fused contrib ops."""
    found = manifest.get("tensorrt_blockers") or {}
    return list(found.get(tower.fp32_file) or [])


def _tower_settings(
    settings: RepositorySettings, manifest: dict[str, Any], tower: Tower
) -> RepositorySettings:
    """The ``tensorrt`` profile serves a tower whose graph TensorRT cannot take whole on the CUDA
    EP instead: ONNX Runtime would otherwise split it between a TensorRT engine and CUDA nodes
    (the text tower's end-of-text pooling, ArgMax over int64 ids and GatherND, is outside the
    parser's table), a partition never measured on a GPU here. The CUDA EP runs any graph."""
    if settings.profile == "tensorrt" and _blockers(manifest, tower):
        return settings.model_copy(update={"profile": "cuda"})
    return settings


def _note_blockers(
    config: mc.ModelConfig, settings: RepositorySettings, manifest: dict[str, Any], tower: Tower
) -> None:
    if settings.profile == "tensorrt" and (blockers := _blockers(manifest, tower)):
        config.parameters[TENSORRT_BLOCKERS_PARAMETER].string_value = (
            "served on the CUDA EP: " + "; ".join(dict.fromkeys(blockers))
        )


def _quantization(out_dir: Path, manifest: dict[str, Any], fallback: str | None) -> None:
    """Each rendered tower's quantization parameter: precision, method and the gate's figures
    (docs/PROFILES.md "The cpu-int8 profile"); served INT8 also gets the INT8 graph's own canary."""
    int8 = manifest.get("int8") or {}
    for model_name, kind in ((TRITON_MODEL_NAME, "image"), (TEXT_MODEL_NAME, "text")):
        path = out_dir / model_name / "config.pbtxt"
        if not path.exists():
            continue
        config = text_format.Parse(path.read_text(), mc.ModelConfig())
        value: dict[str, Any] = {"precision": "fp32" if fallback else "int8"}
        if fallback:
            value |= {"requested": "int8", "fallback": fallback}
        value |= {key: int8[key] for key in ("method", "weights", "activations") if key in int8}
        if figures := (int8.get("figures") or {}).get(kind):
            value |= {
                "calibration_set": figures.get("set"),
                "cosine_vs_fp32": figures.get("vs_fp32"),
                "cosine_vs_open_clip": figures.get("vs_open_clip"),
                "gate": int8.get("thresholds"),
            }
        canary = (int8.get("canary_embedding") or {}).get(kind)
        if not fallback and canary:
            config.parameters[CANARY_PARAMETER].string_value = canary
        config.parameters[QUANTIZATION_PARAMETER].string_value = json.dumps(value)
        path.write_text(text_format.MessageToString(config))


def _model_dir(
    settings: RepositorySettings,
    tower: Tower,
    export_dir: Path,
    out_dir: Path,
    templates: Path,
    link: bool,
) -> Path:
    """``out_dir/<model>/1/`` with the profile's ONNX file (and the cpu profile's model.py)."""
    model_dir = out_dir / tower.model_name
    if model_dir.exists():
        shutil.rmtree(model_dir)
    version_dir = model_dir / "1"
    version_dir.mkdir(parents=True)
    onnx_name = _onnx_file(settings, tower)
    source = export_dir / onnx_name
    if not source.exists():
        how = "--int8" if settings.profile == "cpu-int8" else "FP16 or set cuda_precision=fp32"
        raise FileNotFoundError(f"{source} is missing: export with {how}")
    _place(source, version_dir / onnx_name, link)
    if onnx_name.endswith(".xml"):  # OpenVINO IR: the weights are in the .bin beside it
        weights = onnx_name.removesuffix(".xml") + ".bin"
        _place(export_dir / weights, version_dir / weights, link)
    if _python_backend(settings):  # the Python backend runs ONNX Runtime itself
        shutil.copy2(templates / "python" / "model.py", version_dir / "model.py")
    return model_dir


def _text_parameters(
    config: mc.ModelConfig, manifest: dict[str, Any], export_dir: Path, model_dir: Path, link: bool
) -> None:
    """What the gateway needs to serve text, read from Triton: the tokenizer (its kind and file,
    placed beside the config) and the canary text's embedding."""
    tokenizer = manifest["tokenizer"]
    config.parameters[TOKENIZER_PARAMETER].string_value = tokenizer["kind"]
    placed = model_dir / TOKENIZER_FILE
    _place(export_dir / tokenizer["file"], placed, link)
    config.parameters[TOKENIZER_FILE_PARAMETER].string_value = str(placed.absolute())
    # open_clip's framing around the file (exports from before it was recorded: CLIP BPE's)
    options = {k: tokenizer[k] for k in ("clean", "strip_sep_id", "pooling") if k in tokenizer}
    if options:
        config.parameters[TOKENIZER_OPTIONS_PARAMETER].string_value = json.dumps(options)
    if canary := manifest["towers"]["text"].get("canary_embedding"):
        config.parameters[CANARY_PARAMETER].string_value = canary


def _place(source: Path, target: Path, link: bool) -> None:
    if link:
        target.symlink_to(source.resolve())
    else:
        shutil.copy2(source, target)


def rendered_config(repository: Path) -> mc.ModelConfig:
    """The config ``render`` wrote into ``repository``, parsed."""
    text = (repository / TRITON_MODEL_NAME / "config.pbtxt").read_text()
    return text_format.Parse(text, mc.ModelConfig())
