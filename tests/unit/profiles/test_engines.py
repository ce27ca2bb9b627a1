"""The engine cache (clip_gateway/profiles/engines.py): keyed by GPU model and model identity, one
builder at a time, and nothing half-built left behind by a start-up that did not finish."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from clip_gateway.config.processes import Interrupted
from clip_gateway.model.spec import model_identity
from clip_gateway.profiles import engines
from tests.unprivileged import as_unprivileged, open_directory


def manifest(weights_id: str = "pretrained:laion2b_s34b_b79k", code: str = "abc") -> dict:
    return {"model": "ViT-B-32", "weights": {"id": weights_id}, "export_code_version": code}


def test_new_weights_or_export_code_get_a_new_engine_directory() -> None:
    base = model_identity(manifest())
    assert model_identity(manifest()) == base
    assert model_identity(manifest(weights_id="checkpoint:0123")) != base
    assert model_identity(manifest(code="def")) != base


def test_each_gpu_model_gets_its_own_directory(tmp_path: Path) -> None:
    a10 = engines.cache_dir(tmp_path, "NVIDIA A10", "id")
    a40 = engines.cache_dir(tmp_path, "NVIDIA A40", "id")
    assert a10 != a40 and a10.parent.parent == tmp_path and a10.name == "id"
    assert engines.gpu_slug("NVIDIA A100-SXM4-80GB") == "nvidia-a100-sxm4-80gb"


def key(max_batch: int = 32, opt: int = 32, workspace: int = 4 << 30, trt: str = "10.8.0",
        ort: str = "1.20.1") -> str:  # fmt: skip
    return engines.build_key(max_batch, opt, workspace, tensorrt=trt, onnxruntime=ort)


def test_other_build_settings_get_other_engines(tmp_path: Path) -> None:
    """A larger batch range or workspace, another TensorRT or ONNX Runtime (an image upgrade)
    builds anew rather than trusting old engines."""
    base = key()
    assert base == "trt10.8.0-ort1.20.1-fp16-batch1-32-opt32-ws4096m"
    others = {key(max_batch=64), key(opt=16), key(workspace=2 << 30), key(trt="10.7.0"),
              key(ort="1.20.0")}  # fmt: skip
    assert base not in others and len(others) == 5
    directory = engines.cache_dir(tmp_path, "NVIDIA L4", "id", base)
    assert directory == tmp_path / "nvidia-l4" / "id" / base


def test_the_versions_come_from_the_libraries_the_image_carries(tmp_path: Path) -> None:
    """NGC's layout: libonnxruntime.so.<version> in the onnxruntime backend's directory,
    libnvinfer.so.<version> in a library directory; the most precise file name wins."""
    backends, libs = tmp_path / "backends", tmp_path / "lib"
    (backends / "onnxruntime").mkdir(parents=True)
    libs.mkdir()
    ort = ("libonnxruntime.so", "libonnxruntime.so.1.20.1", "libonnxruntime_providers_tensorrt.so")
    for name in ort:
        (backends / "onnxruntime" / name).touch()
    for name in ("libnvinfer.so.10", "libnvinfer.so.10.8.0", "libnvinfer_plugin.so.10.8.0"):
        (libs / name).touch()
    env = {"LD_LIBRARY_PATH": f"/nonexistent:{libs}"}
    assert engines.runtime_versions(backends, env) == ("10.8.0", "1.20.1")
    # no libraries: NGC's TRT_VERSION variable, else "unknown" (still its own directory)
    assert engines.runtime_versions(tmp_path / "none", {"TRT_VERSION": "10.8.0.43"}) == (
        "10.8.0.43",
        "unknown",
    )


def test_an_unwritable_cache_is_a_start_error_saying_why() -> None:
    """A cache mount this uid cannot write: a CacheUnwritable (a start-up error, which the
    supervisor's fallback turns into the CUDA EP) naming the directory, never a bare
    PermissionError that crashes the start."""

    def acquire(directory: Path) -> str:
        try:
            engines.BuildLock(directory, threading.Event()).acquire(timeout=5)
        except engines.CacheUnwritable as exc:
            return f"refused: {exc}"
        return "acquired"

    with open_directory() as parent:
        cache = parent / "cache"
        cache.mkdir()
        cache.chmod(0o555)  # a volume owned by root
        directory = cache / "gpu" / "model"
        answer = as_unprivileged(lambda: acquire(directory))
        cache.chmod(0o777)  # a volume this uid may write
        assert as_unprivileged(lambda: acquire(directory)) == "acquired"
    assert answer.startswith(f"refused: the TensorRT engine cache {directory} is not writable by")
    assert "Permission denied" in answer and "fsGroup" in answer


def test_the_first_builder_locks_and_the_next_waits(tmp_path: Path) -> None:
    first = engines.BuildLock(tmp_path / "e", threading.Event())
    first.acquire(timeout=60)
    assert first.held
    stop = threading.Event()
    second = engines.BuildLock(tmp_path / "e", stop)
    with pytest.raises(TimeoutError):
        second.acquire(timeout=0)
    stop.set()  # a stop while waiting for the other build ends the wait at once
    with pytest.raises(Interrupted):
        second.acquire(timeout=60)
    (tmp_path / "e" / "graph_sm86.engine").write_bytes(b"built")
    first.release(completed=True)
    assert (tmp_path / "e" / "graph_sm86.engine").exists()
    # engines exist now: loading them needs no lock
    third = engines.BuildLock(tmp_path / "e", threading.Event())
    third.acquire(timeout=0)
    assert not third.held


def test_a_build_that_did_not_finish_leaves_no_engine(tmp_path: Path) -> None:
    directory = tmp_path / "e"
    directory.mkdir()
    older = directory / "timing.cache"
    older.write_bytes(b"from an earlier build")
    past = time.time() - 3600
    os.utime(older, (past, past))
    lock = engines.BuildLock(directory, threading.Event())
    lock.acquire(timeout=60)
    (directory / "graph_sm86.engine").write_bytes(b"trunc")  # the build was cut off here
    lock.release(completed=False)
    assert not engines.has_engines(directory)
    assert older.exists()  # what it did not write stays
    again = engines.BuildLock(directory, threading.Event())
    again.acquire(timeout=0)  # the lock was given back
    assert again.held
    again.release(completed=True)
