"""The quality gates (profiles/gates.py): one protocol, one gate per kind (the export's ORT INT8
files, OpenVINO BF16, OpenVINO INT8), each asked the same way whether an operator named the
profile or ``auto`` has it as a candidate, each refusing in the one text (model/gate.py), and one
rule for what a refusal does: the launch refused saying what to do, or the FP32 graphs served in
the profile's place (its fallback setting, or ``auto``) with its core plan, saying why."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from clip_gateway.config.processes import LaunchError
from clip_gateway.config.settings import Profile, Settings
from clip_gateway.model.gate import Thresholds
from clip_gateway.profiles import bf16, gates, int8_openvino
from clip_gateway.profiles.choice import Selection, Serving
from clip_gateway.profiles.gates import PYTHON_BACKEND_ONLY, Gate
from tests.unit.launcher.test_repository import int8_export
from tests.unit.profiles.fake_host import FakeHost
from tests.unit.profiles.test_bf16 import COOPER_LAKE, FIGURES, ICE_LAKE, SAPPHIRE_RAPIDS

#: Figures below the default gate (mean 0.998, min 0.99) on the image tower.
POOR = {"image": {"set": "photos", "vs_fp32": {"mean": 0.9, "min": 0.5, "count": 48}}}


def choice(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    profile: str,
    flags: str = SAPPHIRE_RAPIDS,
    backend: str = "python",
    **launch: object,
) -> Selection:
    """The profiles' choice on a CPU with these flags; no Triton env, nothing timed."""
    monkeypatch.setattr(bf16, "cpu_flags", lambda: frozenset(flags.split()))
    settings = Settings.from_env(
        repository={"profile": profile, "cpu_backend": backend,
                    "trt_cache_path": str(tmp_path / "cache")},
        launch={"plan_measure_s": 0} | launch,
    )  # fmt: skip
    return Selection(settings, FakeHost(tmp_path / "e"))


def serve(selection: Selection, profile: Profile, export: Path) -> Serving:
    return selection.answer(profile, "as configured", export, math.inf)


def measured(monkeypatch: pytest.MonkeyPatch, figures: dict[str, Any]) -> None:
    """BF16's and OpenVINO INT8's figures, as if measured or built now."""
    monkeypatch.setattr(bf16, "figures", lambda *args, **kwargs: ("2026.4.1", figures))
    record = {"runtimes": {"openvino": "2026.4.1", "nncf": "3.4.0"}, "figures": figures}
    monkeypatch.setattr(int8_openvino, "figures", lambda *args, **kwargs: record)


def never_measured(*args: object, **kwargs: object) -> Any:
    raise AssertionError("measured or built where the gate needs nothing measured")


def test_every_kind_refuses_in_the_one_text_naming_itself(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    export = int8_export(tmp_path / "e")
    manifest = json.loads((export / "manifest.json").read_text())
    manifest["int8"]["figures"] = POOR
    (export / "manifest.json").write_text(json.dumps(manifest))
    measured(monkeypatch, POOR)
    found = {each.subject: each.check(export, math.inf).refused
             for each in choice(monkeypatch, tmp_path, "auto").gates.values()}  # fmt: skip
    one = "{} refused by the quality gate: image tower cosine vs FP32 mean 0.90000 < 0.998, min " \
          "0.50000 < 0.99 (48 items)"  # fmt: skip
    assert found == {kind: one.format(kind) for kind in ("INT8", "BF16", "OpenVINO INT8")}


def test_each_kind_says_how_to_measure_again_when_nothing_was(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    export = int8_export(tmp_path / "e")
    measured(monkeypatch, {})
    found = {each.profile: each.check(export, math.inf).refused
             for each in choice(monkeypatch, tmp_path, "auto").gates.values()}  # fmt: skip
    assert found == {
        "cpu-int8": None,  # the export's own figures pass
        "cpu-bf16": f"no BF16 figures were recorded: measure them again (remove {bf16.RECORD})",
        "cpu-int8-openvino": "no OpenVINO INT8 figures were recorded: build it again (remove "
        f"{int8_openvino.RECORD})",
    }


def test_an_export_without_int8_files_is_refused_saying_how_to_make_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    export = int8_export(tmp_path / "e")
    manifest = json.loads((export / "manifest.json").read_text())
    (export / "manifest.json").write_text(json.dumps({k: v for k, v in manifest.items()
                                                      if k != "int8"}))  # fmt: skip
    chosen = choice(monkeypatch, tmp_path, "cpu-int8")
    with pytest.raises(LaunchError) as refused:
        serve(chosen, "cpu-int8", export)
    assert str(refused.value) == (
        "the cpu-int8 profile is refused: the export has no INT8 files: export again with "
        "--int8. Serve the cpu profile, or set GATEWAY_INT8_FALLBACK=true to fall back to cpu"
    )


@pytest.mark.parametrize("backend", ["python", "onnxruntime"])
def test_without_bf16_units_cpu_bf16_is_refused_and_nothing_is_measured(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, backend: str
) -> None:
    monkeypatch.setattr(bf16, "figures", never_measured)
    chosen = choice(monkeypatch, tmp_path, "cpu-bf16", ICE_LAKE, backend, bf16_fallback=False)
    with pytest.raises(LaunchError, match=r"no BF16 units .*amx_bf16, avx512_bf16"):
        serve(chosen, "cpu-bf16", tmp_path)


def test_openvino_is_refused_on_the_onnxruntime_backend_without_a_check_or_a_build(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The NGC image serves the CPU with Triton's onnxruntime backend, where OpenVINO does not
    run: named or a candidate of ``auto``, neither OpenVINO profile checks or builds anything
    there (a 35 s check, or minutes of NNCF, that must fail)."""
    monkeypatch.setattr(bf16, "figures", never_measured)
    monkeypatch.setattr(int8_openvino, "figures", never_measured)
    chosen = choice(monkeypatch, tmp_path, "auto", COOPER_LAKE, "onnxruntime")
    for profile in ("cpu-bf16", "cpu-int8-openvino"):
        assert chosen.gates[profile].check(tmp_path, math.inf).refused == PYTHON_BACKEND_ONLY
    named = choice(monkeypatch, tmp_path, "cpu-int8-openvino", COOPER_LAKE, "onnxruntime")
    with pytest.raises(LaunchError, match=r"refused: OpenVINO runs in the Python backend only"):
        serve(named, "cpu-int8-openvino", tmp_path)


def test_figures_below_the_gate_refuse_the_launch_saying_what_to_do(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    export = int8_export(tmp_path / "e")
    measured(monkeypatch, POOR)
    cases: dict[Profile, str] = {
        "cpu-bf16": "Serve the cpu or cpu-int8 profile, or set GATEWAY_BF16_FALLBACK=true to "
        "fall back to cpu",
        "cpu-int8-openvino": "Serve the cpu or cpu-int8 profile",
    }
    for profile, instead in cases.items():
        with pytest.raises(LaunchError) as refused:
            serve(choice(monkeypatch, tmp_path, profile), profile, export)
        said = str(refused.value)
        assert said.startswith(f"the {profile} profile is refused: ")
        assert "refused by the quality gate: image tower" in said
        assert said.endswith(f"(48 items). {instead}")


@pytest.mark.parametrize(
    ("profile", "setting", "note"),
    [("cpu-int8", "int8_fallback", "int8_fallback"), ("cpu-bf16", "bf16_fallback", "bf16")],
)
def test_a_refused_profile_falls_back_to_fp32_when_allowed_or_chosen_by_auto(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, profile: Profile, setting: str, note: str
) -> None:
    """The FP32 graphs serve in its place, with the cpu profile's core plan (not the refused
    profile's), and /v1/models and the ready line say why."""
    export = int8_export(tmp_path / "e")
    measured(monkeypatch, POOR)
    manifest = json.loads((export / "manifest.json").read_text())
    manifest["int8"]["figures"] = POOR
    (export / "manifest.json").write_text(json.dumps(manifest))
    for named, launch in ((profile, {setting: True}), ("auto", {})):
        chosen = choice(monkeypatch, tmp_path, named, **launch)
        serving = serve(chosen, profile, export)
        assert (serving.profile, serving.served) == (profile, "cpu")
        subject = chosen.gates[profile].subject
        assert serving.reason.startswith(f"{subject} refused, FP32 serves: ")
        shown = serving.notes[note]
        assert "mean 0.90000 < 0.998" in (shown if note == "int8_fallback" else shown["fallback"])
        assert chosen.planner is not None
        cpu = chosen.planner.plan("cpu")
        assert (serving.repository.instance_count, serving.repository.cpu_threads) == (
            cpu.instances, cpu.threads)  # fmt: skip
        assert f"{subject} refused, serving FP32" in chosen.host.lines[-1]  # type: ignore[attr-defined]


def test_openvino_int8_never_falls_back_even_for_auto(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """An operator who named it chose INT8 on OpenVINO; ``auto`` chose it as it passed the gate
    moments ago: either way nothing else is served in its place."""
    measured(monkeypatch, POOR)
    chosen = choice(monkeypatch, tmp_path, "auto")
    with pytest.raises(LaunchError, match="cpu-int8-openvino profile is refused"):
        serve(chosen, "cpu-int8-openvino", int8_export(tmp_path / "e"))


def test_figures_within_the_gate_serve_and_reach_v1_models(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    export = int8_export(tmp_path / "e")
    measured(monkeypatch, FIGURES)
    chosen = choice(monkeypatch, tmp_path, "cpu-bf16", COOPER_LAKE)
    serving = serve(chosen, "cpu-bf16", export)
    assert (serving.served, serving.reason) == ("cpu-bf16", "as configured")
    section = serving.notes["bf16"]
    assert section["fallback"] is None
    assert section["figures"] == FIGURES and section["openvino"] == "2026.4.1"
    assert section["thresholds"] == serving.notes["gate"] == Thresholds().as_dict()
    assert serve(chosen, "cpu-int8", export).notes["int8_fallback"] is None


def test_each_gated_profile_has_its_gate_in_autos_order() -> None:
    from clip_gateway.profiles import cpu_auto

    found: dict[Profile, Gate] = gates.for_launch(Settings.from_env(), FakeHost())
    assert list(found) == [p for p in cpu_auto.CANDIDATES if p != "cpu"]
    assert all(each.profile == profile for profile, each in found.items())
    assert {p: each.fallback for p, each in found.items()} == {
        "cpu-int8": "GATEWAY_INT8_FALLBACK", "cpu-bf16": "GATEWAY_BF16_FALLBACK",
        "cpu-int8-openvino": None}  # fmt: skip
