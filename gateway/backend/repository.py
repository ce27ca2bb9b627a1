"""Render Triton's model repository for one profile from triton/ templates plus settings."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from string import Template

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from gateway.backend.contract import CANARY_PARAMETER, INPUT_NAME, OUTPUT_NAME, TRITON_MODEL_NAME
from gateway.runtime.settings import PROFILES, RepositorySettings


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
    if settings.profile == "auto":
        raise ValueError("profile 'auto' must be resolved (runtime/profiles.py) before rendering")
    templates = templates or settings.templates_dir or default_templates()
    values = {
        "model_name": TRITON_MODEL_NAME,
        "input_name": INPUT_NAME,
        "output_name": OUTPUT_NAME,
        "image_size": image_size,
        "embed_dim": embed_dim,
        "max_batch_size": settings.max_batch_size,
        "preferred_batch_sizes": ", ".join(map(str, settings.preferred)),
        "max_queue_delay_us": settings.max_queue_delay_us,
        "queue_timeout_us": settings.queue_timeout_us,
        "max_queue_size": settings.max_queue_size,
        "instance_count": settings.instance_count,
        "cpu_threads": settings.cpu_threads,
        "onnx_file": _onnx_file(settings),
        "cuda_graph": int(settings.cuda_graph),
        "trt_cache_path": settings.trt_cache_path,
        "trt_workspace_bytes": settings.trt_workspace_bytes,
        "trt_opt_batch": max(settings.preferred),
    }
    config = mc.ModelConfig()
    for part in ("base.pbtxt", f"profiles/{_profile_template(settings)}.pbtxt"):
        text = Template((templates / part).read_text()).substitute(values)
        text_format.Merge(text, config)
    for batch in settings.warmup:
        warmup = config.model_warmup.add(name=f"batch_{batch}", batch_size=batch, count=1)
        tensor = warmup.inputs[INPUT_NAME]
        tensor.data_type = mc.TYPE_UINT8
        tensor.dims.extend([image_size, image_size, 3])
        tensor.random_data = True
    return config


def _profile_template(settings: RepositorySettings) -> str:
    if settings.profile == "cpu" and settings.cpu_backend == "onnxruntime":
        return "cpu_onnxruntime"
    return settings.profile


def _onnx_file(settings: RepositorySettings) -> str:
    if settings.profile == "cuda" and settings.cuda_precision == "fp16":
        return "model_fp16.onnx"
    return "model.onnx"


def render(
    settings: RepositorySettings,
    export_dir: Path,
    out_dir: Path,
    templates: Path | None = None,
    *,
    link: bool = True,
) -> Path:
    """Write ``out_dir/<model>/{config.pbtxt,1/...}`` for ``settings.profile``; return ``out_dir``.

    ``export_dir`` is a directory written by ``python -m export``. Large ONNX files are symlinked
    (``link=True``) or copied (for images and volumes that must not point elsewhere).
    """
    templates = templates or settings.templates_dir or default_templates()
    manifest = json.loads((export_dir / "manifest.json").read_text())
    config = render_config(settings, manifest["image_size"], manifest["embed_dim"], templates)
    if canary := manifest.get("canary_embedding"):
        config.parameters[CANARY_PARAMETER].string_value = canary
    model_dir = out_dir / TRITON_MODEL_NAME
    if model_dir.exists():
        shutil.rmtree(model_dir)
    version_dir = model_dir / "1"
    version_dir.mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(text_format.MessageToString(config))
    onnx_name = _onnx_file(settings)
    source = export_dir / onnx_name
    if not source.exists():
        raise FileNotFoundError(f"{source} is missing: export with FP16 or set cuda_precision=fp32")
    if link:
        (version_dir / onnx_name).symlink_to(source.resolve())
    else:
        shutil.copy2(source, version_dir / onnx_name)
    if config.backend == "python":
        shutil.copy2(templates / "python" / "model.py", version_dir / "model.py")
    return out_dir


def rendered_config(repository: Path) -> mc.ModelConfig:
    """The config ``render`` wrote into ``repository``, parsed."""
    text = (repository / TRITON_MODEL_NAME / "config.pbtxt").read_text()
    return text_format.Parse(text, mc.ModelConfig())


def main(argv: list[str] | None = None) -> int:
    """``python -m gateway.backend.repository EXPORT_DIR OUT_DIR`` (``GATEWAY_TRITON_*``)."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m gateway.backend.repository", description=__doc__
    )
    parser.add_argument("export_dir", type=Path, help="a directory written by `python -m export`")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--profile", choices=PROFILES, help="overrides GATEWAY_TRITON_PROFILE")
    parser.add_argument("--copy", action="store_true", help="copy ONNX files instead of linking")
    args = parser.parse_args(argv)
    settings = RepositorySettings(**({"profile": args.profile} if args.profile else {}))
    render(settings, args.export_dir, args.out_dir, link=not args.copy)
    print(args.out_dir / TRITON_MODEL_NAME / "config.pbtxt")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
