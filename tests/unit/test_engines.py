"""The engine cache (gateway/runtime/engines.py): keyed by GPU model and model identity, one
builder at a time, and nothing half-built left behind by a start-up that did not finish."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from export.spec import model_identity
from gateway.runtime import engines
from gateway.runtime.processes import Interrupted


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


def test_other_build_settings_get_other_engines(tmp_path: Path) -> None:
    """A larger batch range or workspace builds anew rather than trusting old engines."""
    base = engines.build_key(32, 32, 4 << 30)
    assert base == "fp16-batch1-32-opt32-ws4096m"
    others = {engines.build_key(64, 32, 4 << 30), engines.build_key(32, 16, 4 << 30),
              engines.build_key(32, 32, 2 << 30)}  # fmt: skip
    assert base not in others and len(others) == 3
    directory = engines.cache_dir(tmp_path, "NVIDIA L4", "id", base)
    assert directory == tmp_path / "nvidia-l4" / "id" / base


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
