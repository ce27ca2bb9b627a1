"""The worker plan (config/plan.py): the gateway's share of the cores from each side's measured CPU
per image, thin workers, the settings over both, the container's limits read from its cgroup
files. The model's side (a CPU profile's instances x threads): tests/unit/profiles/test_plans.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from clip_gateway.config.plan import (
    CPU_FIGURES,
    GPU_FIGURES,
    CoreFigures,
    WorkerPlan,
    cgroup_cpu_quota,
    cgroup_memory_limit,
    core_split,
    plan_for,
    worker_plan,
)


def test_the_h200_host_gets_more_thinner_workers_without_a_setting() -> None:
    """bench/results/host/h200-first-2026-11: on the 9 cores the gateway had, 8 single-thread
    workers gave 7,905 images/s and the fixed rule's 2 workers x 4 threads 5,383."""
    assert worker_plan(9) == WorkerPlan(9, 1)
    # the whole host (no load generators beside it): Triton keeps cores in proportion to its
    # CPU per image (the second run: 539 us the gateway, 220 Triton), the gateway's share of 16
    # rounded up
    assert core_split(16, GPU_FIGURES) == (12, 4)
    assert worker_plan(12, figures=GPU_FIGURES) == WorkerPlan(12, 1)


def test_threads_per_worker_come_from_the_measured_figures() -> None:
    """A host whose measurement found 4 decode threads per worker the better shape gets it."""
    threads = CoreFigures(960.0, 692.0, 4, "a host where threads measured better")
    assert worker_plan(16, figures=threads) == WorkerPlan(4, 4)
    assert worker_plan(2, figures=threads) == WorkerPlan(1, 2)


@pytest.mark.parametrize(
    ("cpus", "figures", "split"),
    [
        (2, CPU_FIGURES, (1, 1)),  # the model's CPU per image dwarfs the gateway's
        (64, CPU_FIGURES, (2, 62)),  # 64 x 960 / (960 + 34,843) = 1.7 cores
        (1, GPU_FIGURES, (1, 0)),  # nothing to split
        (2, GPU_FIGURES, (1, 1)),  # Triton keeps at least one
        (9, CoreFigures(100.0, 800.0, 1, "x"), (1, 8)),
        (9, CoreFigures(800.0, 100.0, 1, "x"), (8, 1)),
    ],
)
def test_the_cores_are_split_by_each_sides_cpu_per_image(
    cpus: int, figures: CoreFigures, split: tuple[int, int]
) -> None:
    assert core_split(cpus, figures) == split


@pytest.mark.parametrize(
    ("cpus", "workers", "threads", "plan"),
    [
        (16, 2, 0, (2, 8)),  # workers set: the cores shared between them
        (8, 0, 3, (2, 3)),  # threads set: as many workers as fit
        (8, 3, 1, (3, 1)),
        (64, 0, 0, (32, 1)),  # at most 32 workers
    ],
)
def test_settings_override_the_shape(
    cpus: int, workers: int, threads: int, plan: tuple[int, int]
) -> None:
    assert worker_plan(cpus, workers, threads) == WorkerPlan(*plan)


@pytest.mark.parametrize(("memory_gib", "plan"), [(None, (8, 1)), (64, (8, 1)), (4, (4, 1)),
                                                  (1, (1, 1))])  # fmt: skip
def test_a_memory_limit_caps_the_workers(memory_gib: int | None, plan: tuple[int, int]) -> None:
    """Half the limit for the gateway, where each worker's base (192 MiB) and one 256 MiB
    decode per thread must fit: 4 GiB, 2 GiB for 448 MiB workers, 4 of them."""
    memory = memory_gib << 30 if memory_gib else None
    assert worker_plan(8, memory_bytes=memory) == WorkerPlan(*plan)


def test_a_container_is_split_between_the_gateway_and_triton(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("100000 100000\n")  # 1 CPU (this machine has 2)
    assert plan_for(0, 0, 256, tmp_path, figures=GPU_FIGURES) == WorkerPlan(1, 1, 0)
    assert plan_for(0, 0, 256, tmp_path) == WorkerPlan(1, 1, 0)  # no figures: no split
    assert plan_for(3, 0, 256, tmp_path, figures=GPU_FIGURES) == WorkerPlan(3, 1, 0)


@pytest.mark.parametrize(
    ("cpus", "workers", "threads", "plan"),
    [
        (2, 0, 0, (2, 1)),
        (16, 0, 0, (16, 1)),
        (64, 0, 0, (32, 1)),
        (16, 2, 0, (2, 8)),
        (8, 0, 3, (2, 3)),
    ],
)
def test_worker_plan(cpus: int, workers: int, threads: int, plan: tuple[int, int]) -> None:
    """Thin workers on the gateway's cores (the split and why: above)."""
    assert worker_plan(cpus, workers, threads) == WorkerPlan(*plan)


def test_the_container_limits_are_read_from_cgroup_files(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("250000 100000\n")  # 2.5 CPUs
    (tmp_path / "memory.max").write_text(str(3 << 30))
    assert cgroup_cpu_quota(tmp_path) == 2.5
    assert cgroup_memory_limit(tmp_path) == 3 << 30
    assert plan_for(0, 0, 256, tmp_path) == WorkerPlan(2, 1)
    (tmp_path / "cpu.max").write_text("max 100000\n")
    (tmp_path / "memory.max").write_text("max\n")
    assert cgroup_cpu_quota(tmp_path) is None and cgroup_memory_limit(tmp_path) is None
