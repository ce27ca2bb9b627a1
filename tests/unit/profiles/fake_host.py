"""The launcher as the profiles see it (clip_gateway/profiles/host.py ``Host``) with nothing
behind it: the export it is given, no Triton env, no tritonserver (a profile is timed through
the selection's timer seams instead)."""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from pathlib import Path

from clip_gateway.config.settings import RepositorySettings


class FakeHost:
    def __init__(self, export_dir: Path | None = None) -> None:
        self.stop = threading.Event()
        self.export_dir = export_dir
        #: the progress lines, and each export asked for (with INT8 files or not)
        self.lines: list[str] = []
        self.exports: list[bool] = []

    def progress(self, line: str) -> None:
        self.lines.append(line)

    def export(self, *, int8: bool) -> Path:
        assert self.export_dir is not None, "no export given"
        self.exports.append(int8)
        return self.export_dir

    def trial(
        self, repository: RepositorySettings, export_dir: Path, timeout: float, *,
        image_only: bool = False,
    ) -> AbstractContextManager[str]:  # fmt: skip
        raise AssertionError(f"a tritonserver started to time {repository.profile}")

    def python(self) -> Path:
        return Path("/nonexistent/bin/python3")

    def backend_dir(self) -> Path:
        return Path("/nonexistent/backends")

    def script(self, name: str) -> Path:
        return Path("/nonexistent/triton/python") / name
