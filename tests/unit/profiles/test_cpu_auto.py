"""``auto`` without a GPU (profiles/cpu_auto.py, profiles/choice.py): the CPU profiles that pass
their gates are timed and the fastest serves (the timer is the seam: a candidate made slow there
loses), the figures are kept beside the export so the next start measures nothing, and another
machine or runtime measures again; the first start serves the export's gated INT8 files at once.
The switch in place is tests/unit/launcher/test_supervisor.py's; the timing through a real
Triton is tests/integration/test_bf16_served.py's auto test."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from clip_gateway.config.settings import Profile, RepositorySettings, Settings
from clip_gateway.launcher.repository import render
from clip_gateway.model import gate
from clip_gateway.model.contract import QUANTIZATION_PARAMETER, TEXT_MODEL_NAME, TRITON_MODEL_NAME
from clip_gateway.profiles import bf16, cpu_auto
from clip_gateway.profiles.choice import Selection
from clip_gateway.profiles.plans import model_plan
from tests.unit.launcher.test_repository import int8_export, read
from tests.unit.profiles.fake_host import FakeHost
from tests.unit.profiles.test_bf16 import COOPER_LAKE, FIGURES, ZEN3


class Timer:
    """Images per second per profile, as if measured; records what it was asked to time."""

    def __init__(self, speeds: dict[str, float]) -> None:
        self.speeds = speeds
        self.timed: list[str] = []

    def __call__(self, profile: Profile, budget_s: float) -> list[float]:
        assert budget_s > 0
        self.timed.append(profile)
        if profile not in self.speeds:
            raise RuntimeError(f"{profile} did not load")
        return [self.speeds[profile] * f for f in (0.98, 1.0, 1.02)]


def must_not_measure(profile: Profile, budget_s: float) -> list[float]:
    raise AssertionError(f"measured {profile} again")


def settings(tmp_path: Path, plan_measure_s: float = 0.0, **repository: object) -> Settings:
    return Settings.from_env(
        repository={"profile": "auto", "trt_cache_path": str(tmp_path / "cache")} | repository,
        launch={"auto_measure_s": 60, "plan_measure_s": plan_measure_s},
    )


def selection(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    timer: cpu_auto.Timer,
    flags: str = ZEN3,
    plan_measure_s: float = 0.0,
    export: Path | None = None,
    **repository: object,
) -> Selection:
    """The profiles' choice on a CPU with these flags, and no Triton env to look at (the core
    plan not measured unless ``plan_measure_s``: tests/unit/profiles/test_planner.py's)."""
    monkeypatch.setattr(bf16, "cpu_flags", lambda: frozenset(flags.split()))
    chosen = Selection(settings(tmp_path, plan_measure_s, **repository), FakeHost(export),
                       cpu_timer=timer)  # fmt: skip
    chosen.identity = "model-identity"
    return chosen


def choose(chosen: Selection, export: Path) -> tuple[Profile, str]:
    profile, reason, _ = chosen.race(export, math.inf)
    return profile, reason


@pytest.mark.parametrize(
    ("speeds", "winner"),
    [({"cpu-int8": 40.0, "cpu": 100.0}, "cpu"), ({"cpu-int8": 100.0, "cpu": 40.0}, "cpu-int8")],
)
def test_auto_serves_the_fastest_measured_profile_and_a_slow_one_loses(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, speeds: dict[str, float], winner: str
) -> None:
    export = int8_export(tmp_path / "e")
    timer = Timer(speeds)
    chosen = selection(monkeypatch, tmp_path, timer)
    profile, reason = choose(chosen, export)
    assert profile == winner
    assert timer.timed == ["cpu-int8", "cpu"]  # bf16 refused on this CPU, never timed
    assert "measured now" in reason and "cpu-int8 " in reason and "cpu-bf16 refused" in reason
    assert chosen.profile_choice is not None
    assert chosen.profile_choice["chosen"] == winner
    assert chosen.profile_choice["images_per_s"] == speeds
    assert "no BF16 units" in chosen.profile_choice["refused"]["cpu-bf16"]


def test_bf16_is_timed_where_it_passes_the_gate_and_wins_only_by_speed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(bf16, "figures", lambda *args, **kwargs: ("2026.4.1", FIGURES))
    export = int8_export(tmp_path / "e")
    timer = Timer({"cpu-int8": 101.2, "cpu-bf16": 48.7, "cpu": 39.2})
    chosen = selection(monkeypatch, tmp_path, timer, COOPER_LAKE, cpu_backend="python")
    profile, reason, verdict = chosen.race(export, math.inf)
    assert profile == "cpu-int8"
    assert timer.timed == ["cpu-int8", "cpu-bf16", "cpu"]
    # measured as a candidate, but not what serves: nothing of BF16 is rendered
    serving = chosen.answer(profile, reason, export, math.inf, verdict=verdict)
    assert "bf16" not in serving.notes and serving.notes["int8_fallback"] is None


def test_the_next_start_reuses_the_recorded_choice_without_measuring(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    export = int8_export(tmp_path / "e")
    first = selection(monkeypatch, tmp_path, Timer({"cpu-int8": 40.0, "cpu": 100.0}))
    assert choose(first, export)[0] == "cpu"
    kept = json.loads((export / cpu_auto.RECORD).read_text())
    assert kept["profile"] == "cpu" and kept["signature"]["model"] == "model-identity"
    # the record names the core plan each candidate was timed with
    cpus = kept["signature"]["cpus"]
    assert kept["signature"]["plans"] == {
        p: [model_plan(p, cpus).instances, model_plan(p, cpus).threads] for p in cpu_auto.CANDIDATES
    }
    again = selection(monkeypatch, tmp_path, must_not_measure)
    profile, reason = choose(again, export)
    assert profile == "cpu" and reason.startswith("auto, measured here earlier")
    assert again.profile_choice is not None
    assert again.profile_choice["images_per_s"] == {"cpu-int8": 40.0, "cpu": 100.0}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("cpu", "Another CPU"),
        ("cpus", 64),
        ("runtimes", {"onnxruntime": "0.1"}),
        ("model", "other-weights"),
        ("gate", {"min_mean_cosine": 0.9999, "min_cosine": 0.999}),
        ("plans", {"cpu-int8": [2, 1], "cpu-bf16": [2, 1], "cpu": [1, 2]}),  # an older plan
    ],
)
def test_another_machine_runtime_or_model_measures_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, field: str, value: object
) -> None:
    export = int8_export(tmp_path / "e")
    first = selection(monkeypatch, tmp_path, Timer({"cpu-int8": 40.0, "cpu": 100.0}))
    choose(first, export)
    record = export / cpu_auto.RECORD
    kept = json.loads(record.read_text())
    kept["signature"][field] = value  # as if measured elsewhere, or with other runtimes
    record.write_text(json.dumps(kept))
    timer = Timer({"cpu-int8": 100.0, "cpu": 40.0})
    assert choose(selection(monkeypatch, tmp_path, timer), export)[0] == "cpu-int8"
    assert timer.timed == ["cpu-int8", "cpu"]
    assert json.loads(record.read_text())["profile"] == "cpu-int8"


def test_a_chosen_profile_that_does_not_load_falls_back_to_fp32() -> None:
    from clip_gateway.profiles.choice import FALLBACK

    assert {FALLBACK[p] for p in ("cpu-int8", "cpu-bf16")} == {"cpu"}


def test_a_refused_or_failing_candidate_is_not_chosen(tmp_path: Path) -> None:
    timer = Timer({"cpu": 40.0})  # cpu-bf16 "does not load"
    candidates: dict[Profile, str | None] = {"cpu-int8": "INT8 refused", "cpu-bf16": None,
                                             "cpu": None}  # fmt: skip
    choice = cpu_auto.measure(candidates, timer, {"cpu": "x"}, budget_s=60)
    assert choice.profile == "cpu" and timer.timed == ["cpu-bf16", "cpu"]
    assert choice.refused == {"cpu-int8": "INT8 refused"}
    assert choice.failures == {"cpu-bf16": "cpu-bf16 did not load"}
    nothing = cpu_auto.measure({"cpu-int8": None, "cpu": None}, Timer({}), {}, budget_s=60)
    assert nothing.profile == "cpu" and "nothing measured" in nothing.reason


def test_a_single_gated_candidate_is_served_without_timing(tmp_path: Path) -> None:
    """The container image's baked export has no INT8 files and its onnxruntime backend no
    OpenVINO: FP32 is all there is, and no Triton is started to time it."""
    candidates: dict[Profile, str | None] = {"cpu-int8": "no INT8 files",
                                             "cpu-bf16": "no OpenVINO", "cpu": None}  # fmt: skip
    choice = cpu_auto.measure(candidates, must_not_measure, {}, budget_s=60)
    assert choice.profile == "cpu" and "only CPU profile" in choice.reason
    assert choice.refused == {"cpu-int8": "no INT8 files", "cpu-bf16": "no OpenVINO"}


def test_each_candidate_gets_an_equal_share_of_the_budget() -> None:
    """A share overrun (requests still in flight when its time was up) is not taken from the
    next candidate's: on a loaded host the last one would otherwise not even load."""
    now = [0.0]
    budgets: list[float] = []

    def timer(profile: Profile, budget_s: float) -> list[float]:
        budgets.append(budget_s)
        now[0] += budget_s + 20.0  # each overruns its share by 20 s
        return [1.0]

    candidates: dict[Profile, str | None] = {"cpu-int8": None, "cpu-bf16": None, "cpu": None}
    choice = cpu_auto.measure(candidates, timer, {}, budget_s=90, clock=lambda: now[0])
    assert budgets == [30.0, 30.0, 30.0]
    assert choice.seconds == 150.0 and not choice.failures


def test_a_read_only_export_keeps_the_choice_in_the_cache_volume(tmp_path: Path) -> None:
    choice = cpu_auto.Choice("cpu", "why", {"cpu": "x"})
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where a directory should be: not writable there
    kept = cpu_auto.keep(choice, [blocked / "sub" / cpu_auto.RECORD, tmp_path / "v" / "r.json"])
    assert kept == tmp_path / "v" / "r.json"
    assert cpu_auto.recorded(kept, {"cpu": "x"}) == choice


def test_the_choice_and_its_figures_reach_each_towers_quantization_parameter(
    tmp_path: Path,
) -> None:
    section = {"chosen": "cpu-int8", "images_per_s": {"cpu-int8": 101.2, "cpu": 39.2}}
    export = int8_export(tmp_path / "e")
    repo = render(RepositorySettings(profile="cpu-int8"), export, tmp_path / "int8",
                  profile_choice=section)  # fmt: skip
    for model in (TRITON_MODEL_NAME, TEXT_MODEL_NAME):
        value = json.loads(read(repo, model).parameters[QUANTIZATION_PARAMETER].string_value)
        assert value["precision"] == "int8" and "cosine_vs_fp32" in value  # INT8's, kept
        assert value["profile_choice"] == section
    repo = render(RepositorySettings(profile="cpu"), export, tmp_path / "fp32",
                  profile_choice=section | {"chosen": "cpu"})  # fmt: skip
    config = read(repo, TRITON_MODEL_NAME)
    value = json.loads(config.parameters[QUANTIZATION_PARAMETER].string_value)
    assert value == {"precision": "fp32", "profile_choice": section | {"chosen": "cpu"}}


def test_the_first_start_serves_gated_int8_at_once_and_measures_nothing_before_ready(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    export = int8_export(tmp_path / "e")
    chosen = selection(monkeypatch, tmp_path, must_not_measure)
    assert chosen.recorded_choice(export) is None
    _, profile, reason = chosen.auto_cpu(export, math.inf)
    assert profile == "cpu-int8" and chosen.choose_later
    assert reason == ("auto, first start here: the export's INT8 files serve while the CPU "
                      "profiles are built and timed in the background")  # fmt: skip
    chosen.gates["cpu-int8"].thresholds = gate.Thresholds(1.0, 1.0)  # type: ignore[attr-defined]
    _, profile, reason = chosen.auto_cpu(export, math.inf)
    assert profile == "cpu" and "FP32 serves (INT8 refused by the quality gate" in reason
    manifest = json.loads((export / "manifest.json").read_text())
    (export / "manifest.json").write_text(json.dumps(manifest | {"int8": {}}))
    _, profile, reason = chosen.auto_cpu(export, math.inf)
    assert profile == "cpu" and reason.startswith("auto, first start here: FP32 serves while")
