"""Render Triton's model repository for one profile from triton/ templates plus settings."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from string import Template
from typing import Literal

from google.protobuf import text_format
from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from tritonclient.grpc import model_config_pb2 as mc

from gateway.canary import CONFIG_PARAMETER
from gateway.contract import INPUT_NAME, OUTPUT_NAME, TRITON_MODEL_NAME

Profile = Literal["cpu", "cuda", "tensorrt"]
PROFILES: tuple[Profile, ...] = ("cpu", "cuda", "tensorrt")


class RepositorySettings(BaseSettings):
    """How the model is served inside Triton. Env prefix ``GATEWAY_TRITON_``."""

    model_config = SettingsConfigDict(env_prefix="GATEWAY_TRITON_", frozen=True)

    #: Execution profile: ``cpu`` (Python backend + ORT CPU EP), ``cuda`` (ORT CUDA EP),
    #: ``tensorrt`` (ORT TensorRT EP, FP16).
    profile: Profile = "cpu"
    #: Largest batch Triton accepts; the gateway splits bigger requests to fit.
    max_batch_size: int = Field(32, ge=1, le=1024)
    #: Batch sizes the dynamic batcher sends as soon as it has them (values above max are dropped).
    preferred_batch_sizes: tuple[int, ...] = (4, 8, 16, 32)
    #: How long the batcher may hold a request to grow a batch.
    max_queue_delay_us: int = Field(2000, ge=0)
    #: Requests queued longer than this are rejected by Triton (the gateway answers 503).
    queue_timeout_us: int = Field(30_000_000, ge=0)
    #: Requests waiting in Triton's queue before new ones are rejected (0 = unbounded).
    max_queue_size: int = Field(128, ge=0)
    #: Model instances (CPU: processes; GPU: execution contexts on the one GPU).
    instance_count: int = Field(1, ge=1)
    #: ORT intra-op threads for the ``cpu`` profile; 0 lets ORT use every core.
    cpu_threads: int = Field(0, ge=0)
    #: Graph precision for the ``cuda`` profile (``tensorrt`` always builds FP16 engines).
    cuda_precision: Literal["fp16", "fp32"] = "fp16"
    #: CUDA graphs: only valid when every batch has the same shape (see triton/README.md).
    cuda_graph: bool = False
    #: Where TensorRT engines and timing caches live; mount a volume here.
    trt_cache_path: str = "/var/cache/clip-gateway/trt"
    trt_workspace_bytes: int = Field(4 << 30, ge=1 << 26)
    #: Batch sizes run through the model before it turns READY (default: 1, preferred sizes and
    #: max for GPU profiles; 1 for ``cpu``).
    warmup_batch_sizes: tuple[int, ...] | None = None

    @model_validator(mode="after")
    def _batch_sizes_fit(self) -> RepositorySettings:
        too_big = [b for b in self.warmup_batch_sizes or () if b > self.max_batch_size]
        if too_big:
            raise ValueError(f"warmup batch sizes {too_big} exceed max_batch_size")
        return self

    @property
    def preferred(self) -> tuple[int, ...]:
        fitting = sorted({b for b in self.preferred_batch_sizes if 1 <= b <= self.max_batch_size})
        return tuple(fitting) or (self.max_batch_size,)

    @property
    def warmup(self) -> tuple[int, ...]:
        if self.warmup_batch_sizes is not None:
            return tuple(sorted(set(self.warmup_batch_sizes)))
        if self.profile == "cpu":
            return (1,)
        return tuple(sorted({1, *self.preferred, self.max_batch_size}))


def default_templates() -> Path:
    """``triton/`` of the source checkout, or the copy a wheel carries inside the package."""
    here = Path(__file__).resolve().parent
    checkout = here.parent / "triton"
    return checkout if checkout.is_dir() else here / "_triton"


def render_config(
    settings: RepositorySettings,
    image_size: int,
    embed_dim: int,
    templates: Path | None = None,
) -> mc.ModelConfig:
    templates = templates or default_templates()
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
    for part in ("base.pbtxt", f"profiles/{settings.profile}.pbtxt"):
        text = Template((templates / part).read_text()).substitute(values)
        text_format.Merge(text, config)
    for batch in settings.warmup:
        warmup = config.model_warmup.add(name=f"batch_{batch}", batch_size=batch, count=1)
        tensor = warmup.inputs[INPUT_NAME]
        tensor.data_type = mc.TYPE_UINT8
        tensor.dims.extend([image_size, image_size, 3])
        tensor.random_data = True
    return config


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
    templates = templates or default_templates()
    manifest = json.loads((export_dir / "manifest.json").read_text())
    config = render_config(settings, manifest["image_size"], manifest["embed_dim"], templates)
    if canary := manifest.get("canary_embedding"):
        config.parameters[CONFIG_PARAMETER].string_value = canary
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
    if settings.profile == "cpu":
        shutil.copy2(templates / "python" / "model.py", version_dir / "model.py")
    return out_dir


def main(argv: list[str] | None = None) -> int:
    """``python -m gateway.repository EXPORT_DIR OUT_DIR``; settings from ``GATEWAY_TRITON_*``."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m gateway.repository", description=__doc__)
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
