"""What a figure was measured on: the machine's record (CPU, memory, GPU, versions, commit), its
CPU model and load, and a wait for a quiet machine (this one is shared)."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def record() -> dict[str, Any]:
    """The machine in full: CPU, cores, memory, GPU, Python and package versions, commit, time."""
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    versions = {}
    for package in ("torch", "onnxruntime", "numpy", "litestar", "tritonclient", "simplejpeg"):
        try:
            versions[package] = __import__(package).__version__
        except Exception:  # a missing package is just not reported
            versions[package] = None
    import PIL

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    return {
        "cpu": cpu,
        "cores": len(os.sched_getaffinity(0)),
        "memory_gib": round(memory, 1),
        "python": platform.python_version(),
        "gpu": _gpu(),
        "pil_gateway": PIL.__version__,
        "versions": versions,
        "git_commit": commit,
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def imaging() -> dict[str, Any]:
    """The gateway's image libraries here, as ``clip-gateway imaging`` prints them."""
    command = [sys.executable, "-m", "clip_gateway", "imaging"]
    return dict(json.loads(subprocess.run(command, capture_output=True, check=True).stdout))


def _gpu() -> str | None:
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:
        return None


#: Run timed phases only below this 1-minute load average (the machine is shared).
QUIET_LOAD = 0.6


def cpu_load() -> dict[str, Any]:
    """The CPU's model and count and the load averages, as the peer runs record them."""
    model = ""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        model = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines()
                      if line.startswith("Model name")), "")  # fmt: skip
    return {"nproc": os.cpu_count(), "cpu_model": model, "load_avg": list(os.getloadavg())}


def wait_quiet(limit_s: float, threshold: float = QUIET_LOAD) -> dict[str, Any]:
    """Wait (up to ``limit_s``) for the 1-minute load average to fall below ``threshold``; what
    it was when the timed run started, and whether it was quiet."""
    started = time.monotonic()
    while os.getloadavg()[0] >= threshold and time.monotonic() - started < limit_s:
        time.sleep(10)
    load_1m = os.getloadavg()[0]
    return {"load_1m": round(load_1m, 2), "waited_s": round(time.monotonic() - started, 1),
            "quiet": load_1m < threshold}  # fmt: skip
