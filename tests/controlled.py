"""The controllable backend, in two forms kept equal by the contract suite:
``tests/models/control.py`` inside a real tritonserver, and ``tests.fakes.FakeBackend`` in process.

Tests drive either through the same knobs (mode, delay, hold) and synchronise on what the model
reports (arrivals), never on sleeps.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_format

from clip_gateway.config.settings import RepositorySettings
from clip_gateway.launcher.repository import render_config, render_text_config
from clip_gateway.model.contract import (
    CLIP_BPE,
    TOKENIZER_FILE_PARAMETER,
    TOKENIZER_PARAMETER,
)

MODEL_SOURCE = Path(__file__).parent / "models" / "control.py"
IMAGE_SIZE, EMBED_DIM, MAX_BATCH, CONTEXT_LENGTH = 224, 512, 32, 77


@dataclass
class Control:
    """The control file of a control model in a running Triton."""

    path: Path

    def set(self, mode: str = "ok", *, delay_s: float = 0.0, hold: bool = False) -> None:
        staging = self.path.with_suffix(".tmp")
        staging.write_text(json.dumps({"mode": mode, "delay_s": delay_s, "hold": hold}))
        os.replace(staging, self.path)  # the model never reads half a file

    def release(self) -> None:
        current = json.loads(self.path.read_text())
        self.set(current.get("mode", "ok"), delay_s=current.get("delay_s", 0.0))

    def arrivals(self) -> int:
        """Executions that have reached the model so far (warm-up included)."""
        try:
            return len(Path(f"{self.path}.arrivals").read_text().splitlines())
        except FileNotFoundError:
            return 0

    def wait_arrivals(self, at_least: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while self.arrivals() < at_least:
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.arrivals()} arrivals, waited for {at_least}")
            time.sleep(0.01)


def render_control_repository(out_dir: Path, tokenizer_file: Path) -> tuple[Path, Control]:
    """A model repository whose ``clip_image`` and ``clip_text`` are the control model, with the
    production configs (batching, queue policy) of the cpu profile; returns it and its control
    (one file for both)."""
    control = Control(out_dir / "control.json")
    out_dir.mkdir(parents=True, exist_ok=True)
    control.set()
    settings = RepositorySettings(profile="cpu")
    text = render_text_config(settings, CONTEXT_LENGTH, EMBED_DIM)
    text.parameters[TOKENIZER_PARAMETER].string_value = CLIP_BPE
    text.parameters[TOKENIZER_FILE_PARAMETER].string_value = str(tokenizer_file)
    repository = out_dir / "model_repository"
    for config in (render_config(settings, IMAGE_SIZE, EMBED_DIM), text):
        del config.parameters["onnx_file"]
        del config.parameters["intra_op_threads"]
        config.parameters["control_file"].string_value = str(control.path)
        model_dir = repository / config.name
        (model_dir / "1").mkdir(parents=True)
        (model_dir / "config.pbtxt").write_text(text_format.MessageToString(config))
        shutil.copy2(MODEL_SOURCE, model_dir / "1" / "model.py")
    return repository, control


def wait_until(predicate, what: str, timeout: float = 60.0, every: float = 0.02):
    """Poll ``predicate`` until it returns something truthy; fail after a generous ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what} (last: {value!r})")
        time.sleep(every)
