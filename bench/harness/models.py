"""The export and its Triton repository as a user makes them (``python -m clip_gateway.export``,
``clip-gateway render``); the null model (our signature, no model) isolates the gateway's side."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

NULL_MODEL_SOURCE = Path(__file__).parents[1] / "triton_null" / "model.py"


def export(model: str = "ViT-B-32", cache: Path | None = None, *, int8: bool = False) -> Path:
    """The export directory of ``model`` at seed-0 random weights, made once and cached; with
    ``int8`` its INT8 files and their gate's figures in the manifest too."""
    command = [sys.executable, "-m", "clip_gateway.export", "--model", model,
               "--weights", "random:0", "--print-dir", *(["--int8"] if int8 else []),
               *(["--cache-dir", str(cache)] if cache else [])]  # fmt: skip
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode not in (0, 3 if int8 else 0):  # 3: INT8 refused by its gate, FP32 whole
        raise subprocess.CalledProcessError(done.returncode, command)
    return Path(done.stdout.splitlines()[-1])


def render(export_dir: Path, out: Path, profile: str, **settings: object) -> Path:
    """The Triton repository of ``export_dir`` for ``profile`` as the launcher renders it, with
    these GATEWAY_TRITON_* settings (e.g. ``max_batch_size=64``); ``out``."""
    env = os.environ | {f"GATEWAY_TRITON_{name.upper()}": json.dumps(value)
                        if isinstance(value, list) else str(value)
                        for name, value in settings.items()}  # fmt: skip
    command = [sys.executable, "-m", "clip_gateway", "render", "--profile", profile,
               str(export_dir), str(out)]  # fmt: skip
    subprocess.run(command, env=env, stdout=subprocess.DEVNULL, check=True)
    return out


def null_repository(export_dir: Path, out: Path) -> Path:
    """``clip_image`` with our exact signature but no model: isolates the gateway's capacity."""
    render(export_dir, out, "cpu", warmup_batch_sizes=[1])
    model_dir = out / "clip_image"  # the image model's name in Triton (docs/ARCHITECTURE.md)
    config = text_format.Parse((model_dir / "config.pbtxt").read_text(), mc.ModelConfig())
    del config.parameters["canary_embedding"]  # the canary then checks consistency only
    (model_dir / "config.pbtxt").write_text(text_format.MessageToString(config))
    for onnx_file in (model_dir / "1").glob("*.onnx"):
        onnx_file.unlink()
    shutil.copy2(NULL_MODEL_SOURCE, model_dir / "1" / "model.py")
    return out
