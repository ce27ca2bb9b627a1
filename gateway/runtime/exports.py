"""The export to serve: a baked directory (``GATEWAY_MODEL_DIR``), or the export cache's entry
for model + weights, exported on first use by ``python -m export`` in a child process, so torch
never enters the launcher or the servers; a stop request terminates the exporter at once."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from gateway.runtime.processes import Interrupted, LaunchError
from gateway.runtime.settings import LaunchSettings


def find_or_export(
    launch: LaunchSettings, progress: Callable[[str], None], stop: threading.Event
) -> Path:
    """The export to serve: the configured directory, or the cache entry for model +
    weights, exported first if missing (in a child process: it imports torch)."""
    if launch.model_dir is not None:
        if not (launch.model_dir / "manifest.json").is_file():
            raise LaunchError(f"{launch.model_dir} is not an export (no manifest.json)")
        return launch.model_dir
    from export.spec import (
        WeightsUnavailableError,
        cache_entry,
        default_cache_dir,
        weights_from_spec,
    )

    cache = launch.cache_dir or default_cache_dir()
    try:
        weights = weights_from_spec(launch.weights)
        entry = cache_entry(launch.model, weights, cache)
    except WeightsUnavailableError as exc:
        raise LaunchError(str(exc)) from exc
    if (entry / "manifest.json").is_file():
        progress(f"model {launch.model} ({weights.describe()}) from {entry}")
        return entry
    progress(f"exporting {launch.model} ({weights.describe()}) to ONNX, once...")
    started = time.monotonic()
    _export(launch, cache, stop)
    progress(f"exported in {time.monotonic() - started:.0f} s into {entry}")
    return entry


def _export(launch: LaunchSettings, cache: Path, stop: threading.Event) -> None:
    command = [sys.executable, "-m", "export", "--model", launch.model, "--weights",
               launch.weights, "--cache-dir", str(cache), "--print-dir"]  # fmt: skip
    # the exporter's chatter (hundreds of lines) goes to a file, never to the terminal
    with tempfile.TemporaryFile() as output:
        child = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
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
    if child.returncode != 0:
        detail = text.strip().splitlines()[-12:] or ["(no output)"]
        if "No module named" in text:
            detail.append("the exporter needs: pip install 'clip-gateway[export]'")
        raise LaunchError("the model export failed:\n  " + "\n  ".join(detail))
