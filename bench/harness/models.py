"""The bench's model repository: the null model (our exact signature, no model), which isolates
the gateway's side of a hop."""

from __future__ import annotations

import shutil
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from clip_gateway.config.settings import RepositorySettings
from clip_gateway.launcher.repository import render
from clip_gateway.model.contract import TRITON_MODEL_NAME

NULL_MODEL_SOURCE = Path(__file__).parents[1] / "triton_null" / "model.py"


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
