"""Sample a running gateway with py-spy and keep the functions the time went to."""

from __future__ import annotations

import collections
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from gateway.runtime.processes import ServerProcess


def start(process: ServerProcess, seconds: float) -> tuple[subprocess.Popen[bytes], Path] | None:
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if process.process is None or not Path(py_spy).exists():
        return None
    output = Path(tempfile.mkstemp(suffix=".txt")[1])
    spy = subprocess.Popen(
        # --gil: sample the thread holding the GIL, i.e. what a Python-bound core spends on
        [
            py_spy,
            "record",
            "--gil",
            "--format",
            "raw",
            "--rate",
            "100",
            "--duration",
            str(int(seconds)),
            "--pid",
            str(process.process.pid),
            "--output",
            str(output),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    return spy, output


def finish(started: tuple[subprocess.Popen[bytes], Path], target: Path) -> dict[str, Any]:
    """Self and inclusive sample shares per function; the top ones written to ``target``."""
    spy, output = started
    _, stderr = spy.communicate(timeout=120)
    stacks = output.read_text().splitlines() if output.exists() else []
    if spy.returncode != 0 or not stacks:
        return {"error": stderr.decode(errors="replace")[-300:] or "no samples"}
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in stacks:
        stack, _, count = line.rpartition(" ")
        frames = [f for f in stack.split(";") if f]
        n = int(count)
        total += n
        if frames:
            own[_short(frames[-1])] += n
        for frame in {_short(f) for f in frames}:
            inclusive[frame] += n
    lines = [
        f"py-spy --gil: {total} samples of the GIL holder in the gateway under null-model load",
        "",
        "self %  function",
    ]
    lines += [f"{100 * n / total:5.1f}  {name}" for name, n in own.most_common(25)]
    lines += ["", "incl %  function"]
    lines += [f"{100 * n / total:5.1f}  {name}" for name, n in inclusive.most_common(40)]
    target.write_text("\n".join(lines) + "\n")
    return {
        "samples": total,
        "self_top": [(name, round(100 * n / total, 1)) for name, n in own.most_common(10)],
        "file": target.name,
    }


def _short(frame: str) -> str:
    # "function (path/to/module.py:123)" -> "function (module.py)"
    name, _, where = frame.partition(" (")
    return f"{name} ({Path(where.rstrip(')').rsplit(':', 1)[0]).name})" if where else name
