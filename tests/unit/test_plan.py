"""The core plan's rules (config/plan.py): the gateway's share of the cores from each side's
measured CPU per image, thin workers, the settings over both, and the model plan picked from
measured figures (the lowest single-image p50 within 5 % of the best batch throughput)."""

from __future__ import annotations

from pathlib import Path

import pytest

from clip_gateway.config.plan import (
    CPU_FIGURES,
    GPU_FIGURES,
    CoreFigures,
    ModelPlan,
    PlanTiming,
    WorkerPlan,
    choose_model_plan,
    core_split,
    plan_candidates,
    plan_for,
    worker_plan,
)


def test_the_h200_host_gets_more_thinner_workers_without_a_setting() -> None:
    """bench/results/host: on the 9 cores the gateway had, 8 single-thread workers gave 7,905
    images/s and the fixed rule's 2 workers x 4 threads 5,383."""
    assert worker_plan(9) == WorkerPlan(9, 1)
    # the whole host (no load generators beside it): Triton keeps cores in proportion to its
    # CPU per image, the gateway's share of 16 rounded up
    assert core_split(16, GPU_FIGURES) == (10, 6)
    assert worker_plan(10, figures=GPU_FIGURES) == WorkerPlan(10, 1)


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
    ("cpus", "names"),
    [(1, ["1x1"]), (2, ["1x2", "2x1"]), (3, ["1x3", "2x1"]), (16, ["1x16", "2x8", "4x4"]),
     (64, ["1x64", "2x32", "4x16"])],
)  # fmt: skip
def test_the_candidate_plans_share_the_cpus_between_1_2_and_4_instances(
    cpus: int, names: list[str]
) -> None:
    assert [plan.name for plan in plan_candidates(cpus)] == names
    assert all(ModelPlan.parse(plan.name) == plan for plan in plan_candidates(cpus))


ONE, TWO = ModelPlan(1, 2), ModelPlan(2, 1)


@pytest.mark.parametrize(
    ("timings", "chosen"),
    [
        # the case: two single-thread instances slightly ahead on batches, one
        # instance of both threads twice as fast for one image: within 5 %, latency decides
        ({TWO: PlanTiming(41.2, 59.8), ONE: PlanTiming(40.0, 31.0)}, ONE),
        # more than 5 % behind on batches: never chosen for its latency
        ({TWO: PlanTiming(50.0, 59.8), ONE: PlanTiming(47.0, 31.0)}, TWO),
        # exactly 5 % behind still counts as tied
        ({TWO: PlanTiming(40.0, 59.8), ONE: PlanTiming(38.0, 31.0)}, ONE),
        # faster on both
        ({TWO: PlanTiming(30.0, 40.0), ONE: PlanTiming(45.0, 30.0)}, ONE),
        ({TWO: PlanTiming(45.0, 25.0), ONE: PlanTiming(44.0, 30.0)}, TWO),
        # the same latency: fewer instances (one copy of the model)
        ({TWO: PlanTiming(40.0, 30.0), ONE: PlanTiming(40.0, 30.0)}, ONE),
        # measured beside other jobs: 6 % apart, but each plan's rounds spread 10 %: tied
        ({TWO: PlanTiming(12.4, 68.4, 0.10), ONE: PlanTiming(11.7, 32.7, 0.04)}, ONE),
        ({TWO: PlanTiming(12.4, 68.4, 0.02), ONE: PlanTiming(11.7, 32.7, 0.04)}, TWO),
        # a spread past 20 % widens the tie to 20 % only
        ({TWO: PlanTiming(50.0, 68.4, 0.60), ONE: PlanTiming(39.0, 32.7)}, TWO),
        ({TWO: PlanTiming(50.0, 68.4, 0.60), ONE: PlanTiming(40.0, 32.7)}, ONE),
    ],
)
def test_the_lowest_single_image_p50_within_5_percent_of_the_best_throughput_wins(
    timings: dict[ModelPlan, PlanTiming], chosen: ModelPlan
) -> None:
    plan, reason = choose_model_plan(timings)
    assert plan == chosen
    assert reason.startswith(f"{chosen.name}: the lowest single-image p50")
    for candidate, timing in timings.items():  # every figure it was chosen by
        assert f"{candidate.name}: {timing.images_per_s:.1f} img/s" in reason
