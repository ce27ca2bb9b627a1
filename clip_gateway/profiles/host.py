"""What choosing a profile asks of the launcher that hosts it (clip_gateway/launcher/host.py):
the export, a tritonserver of its own to time a profile in, the Triton env's interpreter and
backends, progress lines and the stop. The profiles decide; every process they need is the
launcher's to start and stop."""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

from clip_gateway.config.settings import RepositorySettings


class Host(Protocol):
    #: set when the launch is being stopped: a check, build or timing ends at its next step
    stop: threading.Event

    def progress(self, line: str) -> None:
        """A line for the operator (the terminal of ``clip-gateway serve``, else the log)."""

    def export(self, *, int8: bool) -> Path:
        """The export to serve, made if missing (``int8``: with its INT8 files)."""

    def trial(
        self, repository: RepositorySettings, export_dir: Path, timeout: float, *,
        image_only: bool = False,
    ) -> AbstractContextManager[str]:  # fmt: skip
        """``repository.profile`` served from ``export_dir`` by a tritonserver of its own on
        loopback (``image_only``: the image tower alone), READY within ``timeout`` (a TensorRT
        start holding the engine build lock): its gRPC URL; stopped on leaving."""

    def python(self) -> Path:
        """The Triton env's interpreter: the gates' checks and builds run in it."""

    def backend_dir(self) -> Path:
        """Triton's backends (the onnxruntime backend's and TensorRT's libraries)."""

    def script(self, name: str) -> Path:
        """One of triton/python's scripts (a gate's check or build)."""
