"""Sample a running gateway with py-spy and keep the functions the time went to."""

from __future__ import annotations

import collections
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from clip_gateway.config.processes import ServerProcess


def start(
    process: ServerProcess, seconds: float, *, gil: bool = True
) -> tuple[subprocess.Popen[bytes], Path] | None:
    """py-spy on ``process`` for ``seconds``: the GIL holder only (``gil``), or every thread
    that is running (idle ones excluded), i.e. where its CPU time goes."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if process.process is None or not Path(py_spy).exists():
        return None
    output = Path(tempfile.mkstemp(suffix=".txt")[1])
    spy = subprocess.Popen(
        # --gil: sample the thread holding the GIL, i.e. what a Python-bound core spends on
        [
            py_spy,
            "record",
            *(["--gil"] if gil else []),
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


def finish(
    started: tuple[subprocess.Popen[bytes], Path], target: Path, *, buckets: bool = False
) -> dict[str, Any]:
    """Self and inclusive sample shares per function; the top ones written to ``target``
    (``buckets``: also the shares of the gateway's stages, ``STAGES``)."""
    spy, output = started
    _, stderr = spy.communicate(timeout=120)
    stacks = output.read_text().splitlines() if output.exists() else []
    if spy.returncode != 0 or not stacks:
        return {"error": stderr.decode(errors="replace")[-300:] or "no samples"}
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    stages: collections.Counter[str] = collections.Counter()
    total = 0
    for line in stacks:
        stack, _, count = line.rpartition(" ")
        frames = [f for f in stack.split(";") if f]
        n = int(count)
        total += n
        stages[stage(frames)] += n
        if frames:
            own[_short(frames[-1])] += n
        for frame in {_short(f) for f in frames}:
            inclusive[frame] += n
    command: list[str] = spy.args  # type: ignore[assignment]  # start() passes a list
    what = "of the GIL holder" if "--gil" in command else "of every running thread"
    lines = [f"py-spy: {total} samples {what} in the gateway under null-model load", ""]
    if buckets:
        lines += ["stage %  stage (the innermost frame that names one)"]
        lines += [f"{100 * n / total:5.1f}  {name}" for name, n in stages.most_common()]
        lines += [""]
    lines += ["self %  function"]
    lines += [f"{100 * n / total:5.1f}  {name}" for name, n in own.most_common(25)]
    lines += ["", "incl %  function"]
    lines += [f"{100 * n / total:5.1f}  {name}" for name, n in inclusive.most_common(40)]
    target.write_text("\n".join(lines) + "\n")
    return {
        "samples": total,
        "self_top": [(name, round(100 * n / total, 1)) for name, n in own.most_common(10)],
        "file": target.name,
    } | ({"stages": {k: round(100 * n / total, 1) for k, n in stages.most_common()}}
         if buckets else {})  # fmt: skip


#: (stage, needles) matched from the innermost frame out, the first frame that names a stage
#: owning the sample. A needle is a fragment of the frame's file path, or ``function@fragment``.
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("JPEG decode (libjpeg-turbo)", ("_decode@clip_gateway/imaging/jpeg.py",)),
    ("JPEG header walk", ("clip_gateway/imaging/jpeg.py",)),
    ("RGBX->RGB pack", ("_rgb@clip_gateway/imaging/preprocess.py",)),
    ("resize", ("_resize_box@clip_gateway/imaging/preprocess.py",)),
    ("orientation", ("clip_gateway/imaging/orientation.py",)),
    ("preprocess: the rest (copy into the batch)", ("clip_gateway/imaging/",)),
    ("batching + shared memory", ("clip_gateway/pipeline/batching.py", "clip_gateway/backend/shm")),
    ("gRPC + Triton client", ("grpc", "tritonclient", "clip_gateway/backend/")),
    ("body parsing (multipart)",
     ("multipart", "clip_gateway/http/forms.py", "clip_gateway/http/parsing.py")),
    ("access log + metrics + middleware",
     ("clip_gateway/observability/", "/logging/", "pythonjsonlogger", "prometheus_client",
      "opentelemetry")),
    ("pipeline (admission, service)", ("clip_gateway/pipeline/",)),
    ("response encoding", ("clip_gateway/http/encoding.py", "msgspec", "orjson")),
    ("HTTP server + framework", ("uvicorn", "httptools", "h11", "litestar", "clip_gateway/http/")),
    ("event loop + threads", ("asyncio", "uvloop", "concurrent/futures", "threading.py")),
)  # fmt: skip


def stage(frames: list[str]) -> str:
    """The stage of one sampled stack (outermost frame first), ``other`` if none matches."""
    for frame in reversed(frames):
        function, _, where = frame.partition(" (")
        for name, needles in STAGES:
            for needle in needles:
                wanted, _, fragment = needle.rpartition("@")
                if fragment in where and (not wanted or wanted == function):
                    return name
    return "other"


def _short(frame: str) -> str:
    # "function (path/to/module.py:123)" -> "function (module.py)"
    name, _, where = frame.partition(" (")
    return f"{name} ({Path(where.rstrip(')').rsplit(':', 1)[0]).name})" if where else name
