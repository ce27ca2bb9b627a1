"""The model's side of a CPU profile's core plan (profiles/plans.py): the table's instances x
threads on the CPUs the cgroup allows, the candidates measured (1 x N, 2 x N/2, 4 x N/4), and
the rule that picks one of them (the lowest single-image p50 within 5 % of the best batch
throughput, or the rounds' own spread). Measured and kept: tests/unit/profiles/test_planner.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from clip_gateway.config.plan import usable_cpus
from clip_gateway.profiles.plans import (
    ModelPlan,
    PlanTiming,
    choose_model_plan,
    model_plan,
    plan_candidates,
)


@pytest.mark.parametrize(
    ("profile", "cpus", "instances", "threads", "expected"),
    [("cpu-int8", 2, 0, 0, (2, 1)), ("cpu-int8", 1, 0, 0, (1, 1)),
     ("cpu-int8", 16, 0, 0, (2, 8)), ("cpu-int8", 3, 0, 0, (2, 1)),
     ("cpu", 2, 0, 0, (1, 2)), ("cpu", 16, 0, 0, (1, 16)),
     ("cpu", 16, 4, 0, (4, 4)), ("cpu-int8", 2, 1, 0, (1, 2)), ("cpu", 64, 1, 6, (1, 6))],
)  # fmt: skip
def test_the_model_gets_the_usable_cpus_between_its_instances(
    profile: str, cpus: int, instances: int, threads: int, expected: tuple[int, int]
) -> None:
    """ORT's own default counts the host's cores; the plan counts what the cgroup allows."""
    assert model_plan(profile, cpus, instances, threads) == ModelPlan(*expected)


def test_a_cpu_quota_sets_the_model_plan(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("150000 100000\n")  # 1.5 CPUs: one whole CPU
    assert model_plan("cpu-int8", usable_cpus(tmp_path)) == ModelPlan(1, 1)
    assert model_plan("cpu", usable_cpus(tmp_path)) == ModelPlan(1, 1)


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
