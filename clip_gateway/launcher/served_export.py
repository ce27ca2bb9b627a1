"""The export to serve: a baked directory (``GATEWAY_MODEL_DIR``), or the export cache's entry for
model + weights, exported on first use by ``python -m clip_gateway.export`` in a child process, so
torch never enters the launcher or the servers; a stop request terminates the exporter at once."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from clip_gateway.config.processes import Interrupted, LaunchError, stop_with_parent
from clip_gateway.config.settings import LaunchSettings


def find_or_export(
    launch: LaunchSettings,
    progress: Callable[[str], None],
    stop: threading.Event,
    *,
    int8: bool = False,
    say_found: bool = True,
) -> Path:
    """The export to serve: the configured directory, or the cache entry for model +
    weights, exported first if missing (in a child process: it imports torch); with ``int8``
    (the ``cpu-int8`` profile) its INT8 files and gate figures too. A baked directory is served
    as it is: the launcher's gate refuses one without INT8 figures."""
    if launch.model_dir is not None:
        if (unreadable := _unreadable(launch.model_dir)) is not None:
            raise LaunchError(unreadable)
        if not (launch.model_dir / "manifest.json").is_file():
            raise LaunchError(f"{launch.model_dir} is not an export (no manifest.json)")
        return launch.model_dir
    from clip_gateway.model.spec import (
        WeightsUnavailableError,
        cache_entry,
        default_cache_dir,
        int8_code_version,
        weights_from_spec,
    )

    cache = launch.cache_dir or default_cache_dir()
    try:
        weights = weights_from_spec(launch.weights)
        entry = cache_entry(launch.model, weights, cache, tokenizer=launch.tokenizer)
    except WeightsUnavailableError as exc:
        raise LaunchError(str(exc)) from exc
    manifest = entry / "manifest.json"
    if manifest.is_file() and not (
        int8
        and json.loads(manifest.read_text()).get("int8", {}).get("code_version")
        != int8_code_version()
    ):
        if say_found:
            progress(f"model {launch.model} ({weights.describe()}) from {entry}")
        return entry
    what = "quantizing to INT8" if manifest.is_file() else "exporting to ONNX"
    progress(f"{what}: {launch.model} ({weights.describe()}), once...")
    started = time.monotonic()
    _export(launch, cache, stop, int8)
    progress(f"done in {time.monotonic() - started:.0f} s: {entry}")
    return entry


def _unreadable(directory: Path) -> str | None:
    """Why this process cannot read the baked export, or None: every directory under it must be
    listable and enterable, every file readable (a private 0700 export copied into an image
    keeps its mode, and the image's user is not its owner)."""
    problem: list[OSError] = []
    paths = [directory]
    for root, directories, files in os.walk(directory, onerror=problem.append):
        paths += [Path(root, name) for name in directories + files]
    for path in paths:
        try:
            info = path.stat()
        except OSError as exc:
            problem.append(exc)
            break
        wanted = os.R_OK | os.X_OK if path.is_dir() else os.R_OK
        if not os.access(path, wanted):
            return (
                f"the export {directory} is not readable by uid {os.getuid()}: {path} has mode "
                f"{info.st_mode & 0o7777:04o}, owner uid {info.st_uid}; make it readable "
                "(chmod -R a+rX) where it is built"
            )
    if problem and not isinstance(problem[0], FileNotFoundError):
        return f"the export {directory} is not readable by uid {os.getuid()}: {problem[0]}"
    return None


#: ``python -m clip_gateway.export``'s exit code when the FP32 export is fine and only INT8 was
#: refused by the gate (clip_gateway/export/__main__.py): the launcher checks the figures
#: itself, against its settings.
INT8_REFUSED = 3


def _export(launch: LaunchSettings, cache: Path, stop: threading.Event, int8: bool) -> None:
    command = [sys.executable, "-m", "clip_gateway.export", "--model", launch.model, "--weights",
               launch.weights, "--cache-dir", str(cache), "--print-dir"]  # fmt: skip
    if int8:
        command.append("--int8")
    if launch.tokenizer is not None:
        command += ["--tokenizer", str(launch.tokenizer)]
    # the exporter's chatter (hundreds of lines) goes to a file, never to the terminal
    with tempfile.TemporaryFile() as output:
        # a launcher killed outright (SIGKILL, OOM) takes the exporter with it
        with_parent = functools.partial(stop_with_parent, os.getpid())
        child = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT,
                                 preexec_fn=with_parent)  # fmt: skip
        while child.poll() is None:
            if stop.wait(0.2):
                child.terminate()
                child.wait()
                raise Interrupted("stop requested during the export")
        output.seek(0)
        text = output.read().decode(errors="replace")
    if launch.log_file is not None:
        with open(launch.log_file, "a") as log_file:
            log_file.write(text)
    if child.returncode != 0 and not (int8 and child.returncode == INT8_REFUSED):
        detail = text.strip().splitlines()[-12:] or ["(no output)"]
        if "No module named" in text:
            detail.append("the exporter needs: pip install 'clip-gateway[export]'")
        raise LaunchError("the model export failed:\n  " + "\n  ".join(detail))
