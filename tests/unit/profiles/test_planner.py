"""A CPU profile's core plan measured once per machine (profiles/planner.py): each candidate
timed (the timer is the seam: figures given here decide), the rule's choice kept beside the
export and reused, measured again when the machine, its runtimes, the model or the profile
change, never when the settings fix the plan; the chosen plan is what the model repository is
rendered with, and /v1/models (each tower's quantization parameter) and the ready line say
which and by what figures. The timing through a real Triton is
tests/integration/test_core_plan_first_start.py's."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from clip_gateway.config import plan
from clip_gateway.config.settings import Profile
from clip_gateway.launcher.repository import render
from clip_gateway.model.contract import QUANTIZATION_PARAMETER, TEXT_MODEL_NAME, TRITON_MODEL_NAME
from clip_gateway.profiles import planner as core_plan
from clip_gateway.profiles.choice import Selection
from clip_gateway.profiles.plans import ModelPlan, PlanTiming, plan_candidates
from tests.unit.launcher.test_repository import int8_export, read
from tests.unit.profiles.test_cpu_auto import must_not_measure, selection

#: the issue's 2-core Xeon: two single-thread instances a little ahead on batches, one instance
#: of both threads twice as fast for a single image
XEON = {"2x1": PlanTiming(41.2, 59.8), "1x2": PlanTiming(40.4, 29.5)}


class PlanTimer:
    """Figures per plan, as if measured; records what it was asked to time."""

    def __init__(self, figures: dict[str, PlanTiming]) -> None:
        self.figures = figures
        self.timed: list[tuple[str, str]] = []

    def __call__(self, profile: str, candidate: ModelPlan, budget_s: float) -> PlanTiming:
        assert budget_s > 0
        self.timed.append((profile, candidate.name))
        if candidate.name not in self.figures:
            raise RuntimeError(f"{candidate.name} did not load")
        return self.figures[candidate.name]


def never(profile: str, candidate: ModelPlan, budget_s: float) -> PlanTiming:
    raise AssertionError(f"timed {profile} {candidate.name} again")


def cpu_launcher(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    timer: core_plan.ProfileTimer,
    cpus: int = 2,
    plan_measure_s: float = 60.0,
    **repository: object,
) -> Selection:
    """The profiles' choice on a machine with ``cpus`` usable CPUs, its plan timer the given
    one."""
    monkeypatch.setattr(plan, "usable_cpus", lambda root=plan.CGROUP: cpus)
    repository = {"cpu_backend": "python"} | repository
    chosen = selection(monkeypatch, tmp_path, must_not_measure, plan_measure_s=plan_measure_s,
                       **repository)  # fmt: skip
    chosen.plan_timer = timer
    return chosen


def first_start(chosen: Selection, export: Path, profile: Profile = "cpu-int8") -> bool:
    """What the start does for a CPU profile: look the plan up; True when it is to be measured
    after ready."""
    return chosen.answer(profile, "as configured", export, math.inf).later


def measure(chosen: Selection, export: Path, profile: Profile = "cpu-int8") -> None:
    chosen.measure_plan(profile, export, math.inf)


def rendered(
    chosen: Selection, export: Path, tmp_path: Path, profile: Profile = "cpu-int8"
) -> Path:
    """The repository as it would be rendered now (the plan as the planner has it)."""
    serving = chosen.answer(profile, "as configured", export, math.inf)
    return render(serving.repository, export, tmp_path / "repo", **serving.notes)


def plan_of(repo: Path, model: str) -> tuple[int, str, dict[str, object]]:
    """(instance count, intra-op threads, core_plan section) of a rendered model."""
    config = read(repo, model)
    section = json.loads(config.parameters[QUANTIZATION_PARAMETER].string_value)["core_plan"]
    return (config.instance_group[0].count, config.parameters["intra_op_threads"].string_value,
            section)  # fmt: skip


def test_the_first_start_measures_and_the_chosen_plan_is_rendered_and_shown(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    export = int8_export(tmp_path / "e")
    timer = PlanTimer(XEON)
    chosen = cpu_launcher(monkeypatch, tmp_path, timer)
    lines: list[str] = chosen.host.lines  # type: ignore[attr-defined]
    # the table's plan serves at once, the measured one later
    assert first_start(chosen, export)
    assert chosen.planner is not None
    assert chosen.planner.describe("cpu-int8").startswith(
        "core plan 2 instance(s) x 1 thread(s) per tower (the table"
    )
    # until measured, the table's plan (cpu-int8: 2 x 1) is rendered and says so
    count, threads, section = plan_of(rendered(chosen, export, tmp_path / "a"),
                                      TRITON_MODEL_NAME)  # fmt: skip
    assert (count, threads) == (2, "1") and "until measured here" in str(section["by"])
    measure(chosen, export)
    assert timer.timed == [("cpu-int8", "1x2"), ("cpu-int8", "2x1")]
    assert "core plan: timing cpu-int8 as 1x2, 2x1" in lines[0]
    for model in (TRITON_MODEL_NAME, TEXT_MODEL_NAME):  # both towers get the plan
        count, threads, section = plan_of(rendered(chosen, export, tmp_path / "b"), model)
        assert (count, threads) == (1, "2")
        assert (section["instances"], section["threads"]) == (1, 2)
        assert str(section["by"]).startswith("measured now")
        assert section["measured"] == {
            "1x2": {"images_per_s": 40.4, "single_p50_ms": 29.5, "spread": 0.0},
            "2x1": {"images_per_s": 41.2, "single_p50_ms": 59.8, "spread": 0.0},
        }
        assert "within 5 % (or the rounds' spread, at most 20 %)" in str(section["rule"])
    assert chosen.planner.describe("cpu-int8") == (
        "core plan 1 instance(s) x 2 thread(s) per tower, measured here: single image p50 "
        "29.5 ms, 40.4 img/s at batch 32 x 4"
    )
    kept = json.loads((export / core_plan.RECORD).read_text())["plans"]["cpu-int8"]
    assert kept["plan"] == "1x2" and kept["signature"]["profile"] == "cpu-int8"
    assert kept["signature"]["cpus"] == 2


def test_the_next_start_serves_the_recorded_plan_without_measuring(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    export = int8_export(tmp_path / "e")
    first = cpu_launcher(monkeypatch, tmp_path, PlanTimer(XEON))
    assert first_start(first, export)
    measure(first, export)
    again = cpu_launcher(monkeypatch, tmp_path, never)
    assert not first_start(again, export)
    count, threads, section = plan_of(rendered(again, export, tmp_path), TRITON_MODEL_NAME)
    assert (count, threads) == (1, "2")
    assert str(section["by"]).startswith(f"measured here earlier ({export / core_plan.RECORD})")


def another_machine(kept: dict[str, object], field: str, value: object) -> None:
    signature = kept["signature"]
    assert isinstance(signature, dict)
    signature[field] = value


@pytest.mark.parametrize(
    ("field", "value"),
    [("cpu", "Another CPU"), ("flags", "0" * 16), ("cpus", 64),
     ("runtimes", {"onnxruntime": "0.1"}), ("backend", "onnxruntime"), ("model", "other"),
     ("profile", "cpu")],
)  # fmt: skip
def test_a_changed_signature_measures_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, field: str, value: object
) -> None:
    export = int8_export(tmp_path / "e")
    first = cpu_launcher(monkeypatch, tmp_path, PlanTimer(XEON))
    first_start(first, export)
    measure(first, export)
    record = export / core_plan.RECORD
    data = json.loads(record.read_text())
    another_machine(data["plans"]["cpu-int8"], field, value)  # as if measured elsewhere
    record.write_text(json.dumps(data))
    timer = PlanTimer({"2x1": PlanTiming(50.0, 59.8), "1x2": PlanTiming(40.0, 29.5)})
    again = cpu_launcher(monkeypatch, tmp_path, timer)
    assert first_start(again, export)
    measure(again, export)
    assert len(timer.timed) == 2
    assert json.loads(record.read_text())["plans"]["cpu-int8"]["plan"] == "2x1"


def test_each_profile_keeps_its_own_plan(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    export = int8_export(tmp_path / "e")
    chosen = cpu_launcher(monkeypatch, tmp_path, PlanTimer(XEON))
    first_start(chosen, export, "cpu-int8")
    measure(chosen, export, "cpu-int8")
    timer = PlanTimer({"2x1": PlanTiming(30.0, 60.0), "1x2": PlanTiming(14.0, 90.0)})
    other = cpu_launcher(monkeypatch, tmp_path, timer)
    assert first_start(other, export, "cpu")  # cpu-int8's plan says nothing about FP32's
    measure(other, export, "cpu")
    kept = json.loads((export / core_plan.RECORD).read_text())["plans"]
    assert {p: c["plan"] for p, c in kept.items()} == {"cpu-int8": "1x2", "cpu": "2x1"}


@pytest.mark.parametrize(
    ("setting", "expected"),
    [({"instance_count": 1}, (1, "2")), ({"cpu_threads": 1}, (2, "1")),
     ({"instance_count": 2, "cpu_threads": 2}, (2, "2"))],
)  # fmt: skip
def test_settings_fix_the_plan_and_nothing_is_measured(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, setting: dict[str, int],
    expected: tuple[int, str],
) -> None:  # fmt: skip
    export = int8_export(tmp_path / "e")
    chosen = cpu_launcher(monkeypatch, tmp_path, never, **setting)
    assert not first_start(chosen, export)
    count, threads, section = plan_of(rendered(chosen, export, tmp_path), TRITON_MODEL_NAME)
    assert (count, threads) == expected
    assert "settings" in str(section["by"])
    assert not (export / core_plan.RECORD).exists()


def test_plan_measure_s_0_serves_the_table_and_measures_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    export = int8_export(tmp_path / "e")
    chosen = cpu_launcher(monkeypatch, tmp_path, never, plan_measure_s=0)
    assert not first_start(chosen, export)
    _, _, section = plan_of(rendered(chosen, export, tmp_path), TRITON_MODEL_NAME)
    assert "GATEWAY_PLAN_MEASURE_S=0" in str(section["by"])


def test_one_cpu_has_one_plan_and_nothing_is_timed() -> None:
    choice = core_plan.measure("cpu-int8", plan_candidates(1), lambda p, b: never("", p, b),
                               {}, budget_s=60, provisional=ModelPlan(1, 1))  # fmt: skip
    assert choice.plan == "1x1" and choice.reason == "the only plan on one CPU"


def test_a_plan_that_fails_loses_and_nothing_measured_keeps_the_table() -> None:
    timer = PlanTimer({"2x1": PlanTiming(30.0, 60.0)})
    candidates = plan_candidates(2)
    choice = core_plan.measure("cpu-int8", candidates, lambda p, b: timer("cpu-int8", p, b), {},
                               budget_s=60, provisional=ModelPlan(2, 1))  # fmt: skip
    assert choice.plan == "2x1" and choice.failures == {"1x2": "1x2 did not load"}
    nothing = PlanTimer({})
    choice = core_plan.measure("cpu-int8", candidates, lambda p, b: nothing("cpu-int8", p, b),
                               {}, budget_s=60, provisional=ModelPlan(2, 1))  # fmt: skip
    assert choice.plan == "2x1" and "nothing measured" in choice.reason


def test_each_candidate_gets_an_equal_share_of_the_budget() -> None:
    budgets: list[float] = []

    def timer(candidate: ModelPlan, budget_s: float) -> PlanTiming:
        budgets.append(budget_s)
        return PlanTiming(10.0, 10.0)

    core_plan.measure("cpu", plan_candidates(16), timer, {}, budget_s=90,
                      provisional=ModelPlan(1, 16))  # fmt: skip
    assert budgets == [30.0, 30.0, 30.0]


def test_the_measured_plan_feeds_the_worker_plan(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The model's CPU per image is every usable CPU over the chosen plan's images/s."""
    export = int8_export(tmp_path / "e")
    chosen = cpu_launcher(monkeypatch, tmp_path, PlanTimer(XEON))
    first_start(chosen, export)
    assert chosen.planner is not None
    assert chosen.planner.figures("cpu-int8") == plan.CPU_FIGURES  # until measured
    measure(chosen, export)
    figures = chosen.planner.figures("cpu-int8")
    assert figures.model_us == pytest.approx(2 * 1e6 / 40.4)
    assert figures.source == "the cpu-int8 plan measured here"
    assert plan.core_split(2, figures) == (1, 1)


def test_a_read_only_export_keeps_the_plan_in_the_cache_volume(tmp_path: Path) -> None:
    choice = core_plan.PlanChoice("cpu", "1x2", "why", {"cpu": "x"})
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where a directory should be: not writable there
    kept = core_plan.keep(choice, [blocked / "sub" / core_plan.RECORD, tmp_path / "v" / "r.json"])
    assert kept == tmp_path / "v" / "r.json"
    assert core_plan.recorded([blocked / "sub" / core_plan.RECORD, kept], "cpu",
                              {"cpu": "x"}) == choice  # fmt: skip
    assert core_plan.recorded([kept], "cpu-int8", {"cpu": "x"}) is None


#: Figures per profile and plan (this machine's peers run, through the gateway).
PROFILE_PLANS = {
    "cpu-int8": {"1x2": PlanTiming(28.2, 40.0), "2x1": PlanTiming(16.2, 60.0)},
    "cpu-bf16": {"1x2": PlanTiming(20.3, 93.1), "2x1": PlanTiming(25.0, 60.0)},
    "cpu": {"1x2": PlanTiming(4.0, 300.0), "2x1": PlanTiming(3.4, 400.0)},
}


class ProfilePlans:
    """Times a profile's plan from ``PROFILE_PLANS``; records what it was asked to time."""

    def __init__(self) -> None:
        self.timed: list[tuple[str, str]] = []

    def __call__(self, profile: str, candidate: ModelPlan, budget_s: float) -> PlanTiming:
        self.timed.append((profile, candidate.name))
        return PROFILE_PLANS[profile][candidate.name]


def test_auto_races_each_profile_at_its_best_plan_and_keeps_the_plans(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """At the table's plans cpu-bf16 (1 x 2: 20.3 images/s) would beat cpu-int8 (2 x 1: 16.2);
    at each one's best plan cpu-int8 (1 x 2: 28.2) wins, and serves with that plan, measured
    once: nothing is timed again for it after the race."""
    from clip_gateway.profiles import cpu_auto

    export = int8_export(tmp_path / "e")
    timer = ProfilePlans()
    chosen = cpu_launcher(monkeypatch, tmp_path, timer)
    first_start(chosen, export)  # the provisional profile's planner
    race = chosen.race_timer(export)
    candidates: dict[str, str | None] = {"cpu-int8": None, "cpu-bf16": None, "cpu": None}
    choice = cpu_auto.measure(candidates, race, {}, budget_s=120)  # type: ignore[arg-type]
    assert choice.profile == "cpu-int8"
    assert choice.medians() == {"cpu-int8": 28.2, "cpu-bf16": 25.0, "cpu": 4.0}
    assert len(timer.timed) == 6  # two plans of each
    assert chosen.planner is not None
    assert not chosen.planner.settle("cpu-int8")  # measured now: not again
    count, threads, section = plan_of(rendered(chosen, export, tmp_path), TRITON_MODEL_NAME)
    assert (count, threads) == (1, "2") and str(section["by"]).startswith("measured now")
    kept = json.loads((export / core_plan.RECORD).read_text())["plans"]
    assert {p: c["plan"] for p, c in kept.items()} == {"cpu-int8": "1x2", "cpu-bf16": "2x1",
                                                       "cpu": "1x2"}  # fmt: skip


def test_a_fixed_plan_is_raced_as_set(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    export = int8_export(tmp_path / "e")
    timer = ProfilePlans()
    chosen = cpu_launcher(monkeypatch, tmp_path, timer, instance_count=2)
    first_start(chosen, export)
    race = chosen.race_timer(export)
    assert race("cpu-int8", 60) == [16.2] and race("cpu-bf16", 60) == [25.0]
    assert timer.timed == [("cpu-int8", "2x1"), ("cpu-bf16", "2x1")]
    assert not (export / core_plan.RECORD).exists()
