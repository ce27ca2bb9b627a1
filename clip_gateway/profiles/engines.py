"""The TensorRT engine cache: a directory per GPU model and model identity, safe to share.

- **Keyed by the model's identity** (model, weights, export code version:
  ``clip_gateway.model.spec``): ONNX Runtime names a cached engine by a hash of the graph's
  structure and names, not its initialiser values, so an image with new weights of the same
  architecture would otherwise load the old engine (and the canary would keep /readyz at 503).
- **Keyed by the GPU model**: engines are built for the GPU they run on, and ORT's file names
  carry only the compute capability (an A10 and an A40 are both sm_86).
- **Keyed by the build settings** (``build_key``): precision, batch range, workspace, and the
  TensorRT and ONNX Runtime versions that build and load the engines (``runtime_versions``): an
  image upgrade gets a new directory instead of reusing, or half-reusing, another TensorRT's
  engines.
- **One builder at a time**: pods that share the cache (a ReadWriteMany volume per GPU model)
  and start on an empty directory would build the same engine files concurrently; the first
  takes ``.build.lock`` (flock, honoured over NFS too) and builds, the others wait and then
  load what it built. Once engines exist nobody locks.
- **A cache this user cannot write** (a bind mount owned by another uid, NFS without fsGroup) is
  a start-up error of the TensorRT profile that says why (``CacheUnwritable``): an automatically
  chosen TensorRT then falls back to the CUDA EP (profiles/choice.py) instead of crashing.
- **No half-written engines**: a start-up stopped (or failed) while it held the lock removes the
  files it wrote, so the next start never deserialises a truncated engine.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import threading
import time
from pathlib import Path
from typing import IO

from clip_gateway.config.processes import Interrupted, ProcessStartError

log = logging.getLogger(__name__)

LOCK_NAME = ".build.lock"
CALIBRATION_NAME = "calibration.json"


def gpu_slug(name: str) -> str:
    """``NVIDIA A100-SXM4-80GB`` → ``nvidia-a100-sxm4-80gb``: a directory name per GPU model."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown-gpu"


def same_gpu(a: str, b: str) -> bool:
    """One GPU model: equal names, ignoring case, spacing and the "NVIDIA " prefix that older
    drivers leave out."""

    def canonical(name: str) -> str:
        words = name.casefold().split()
        return " ".join(words[1:] if words[:1] == ["nvidia"] else words)

    return canonical(a) == canonical(b)


#: Where the TensorRT libraries are in NGC images (and in the onnxruntime backend's directory).
TENSORRT_LIB_DIRS = (Path("/usr/lib/x86_64-linux-gnu"), Path("/usr/local/tensorrt/lib"))


class CacheUnwritable(ProcessStartError):
    """The engine cache cannot be written by this process: TensorRT cannot keep its engines."""


def _library_version(name: str, directories: list[Path]) -> str | None:
    """``libnvinfer.so.10.8.0`` → ``10.8.0``: the most precise version among the files found."""
    versions = [
        path.name[len(name) + 1 :]
        for directory in directories
        for path in directory.glob(f"{name}.*")
        if re.fullmatch(r"[0-9]+(\.[0-9]+)*", path.name[len(name) + 1 :])
    ]
    return max(versions, key=lambda v: (v.count("."), v), default=None)


def runtime_versions(backend_dir: Path, environ: dict[str, str] | None = None) -> tuple[str, str]:
    """(TensorRT, ONNX Runtime) versions the engines are built and loaded by: from the libraries'
    file names (the onnxruntime backend's ``libonnxruntime.so.1.20.1``, ``libnvinfer.so.10.8.0``),
    else NGC's ``TRT_VERSION`` / an ``ORT_VERSION`` variable; ``unknown`` when neither says."""
    env = os.environ if environ is None else environ
    ort_dir = backend_dir / "onnxruntime"
    searched = [ort_dir, *TENSORRT_LIB_DIRS]
    searched += [Path(d) for d in env.get("LD_LIBRARY_PATH", "").split(":") if d]
    tensorrt = _library_version("libnvinfer.so", searched) or env.get("TRT_VERSION")
    onnxruntime = _library_version("libonnxruntime.so", [ort_dir]) or env.get("ORT_VERSION")
    return tensorrt or "unknown", onnxruntime or "unknown"


def build_key(
    max_batch: int, opt_batch: int, workspace_bytes: int, *, tensorrt: str, onnxruntime: str
) -> str:
    """What an engine is built for and by besides the GPU and the model: FP16, the optimisation
    profile's batch range, the builder's workspace, the TensorRT and ONNX Runtime versions. A
    change gets a directory of its own, never depending on ONNX Runtime noticing that the
    cached profile no longer fits or that another TensorRT wrote the engines."""
    versions = f"trt{tensorrt}-ort{onnxruntime}"
    return f"{versions}-fp16-batch1-{max_batch}-opt{opt_batch}-ws{workspace_bytes >> 20}m"


def cache_dir(base: str | Path, gpu: str | None, identity: str, build: str | None = None) -> Path:
    directory = Path(base) / (gpu_slug(gpu) if gpu else "any-gpu") / identity
    return directory / build if build else directory


def has_engines(directory: Path) -> bool:
    return any(directory.glob("*.engine"))


class BuildLock:
    """Held from before Triton starts until the model is READY, by the pod that builds."""

    def __init__(self, directory: Path, stop: threading.Event) -> None:
        self.directory = directory
        self.stop = stop
        self.started = time.time()
        self._file: IO[bytes] | None = None

    @property
    def held(self) -> bool:
        return self._file is not None

    def acquire(self, timeout: float) -> None:
        """Wait for the lock unless engines exist (then: nothing to build, no lock)."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            if has_engines(self.directory):
                return
            lock = open(self.directory / LOCK_NAME, "ab")  # noqa: SIM115 (held open: the lock)
        except OSError as exc:
            raise CacheUnwritable(
                f"the TensorRT engine cache {self.directory} is not writable by uid {os.getuid()} "
                f"({exc.strerror or exc}): mount it writable for this user (Kubernetes: fsGroup)"
            ) from exc
        deadline = time.monotonic() + timeout
        announced = False
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not announced:
                    log.info("another process is building engines in %s; waiting", self.directory)
                    announced = True
                if time.monotonic() > deadline:
                    lock.close()
                    raise TimeoutError(f"engine build lock in {self.directory} not free") from None
                if self.stop.wait(1.0):
                    lock.close()
                    raise Interrupted("stop requested while waiting for an engine build") from None
        if has_engines(self.directory):  # built while we waited
            lock.close()
            return
        self.started = time.time()
        self._file = lock

    def release(self, *, completed: bool) -> None:
        """Drop the lock; unless the build completed, remove what this start-up wrote."""
        if self._file is None:
            return
        if not completed:
            for path in self.directory.iterdir():
                written = path.is_file() and path.stat().st_mtime >= self.started
                if written and path.name != LOCK_NAME:
                    log.warning("removing %s, written by a start-up that did not finish", path)
                    with contextlib.suppress(OSError):
                        path.unlink()
        self._file.close()
        self._file = None
