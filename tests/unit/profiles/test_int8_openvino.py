"""The cpu-int8-openvino profile's pure parts (profiles/int8_openvino.py): the precision of what
NNCF leaves unquantized (the CPU's flags), the build record's reuse, what the renderer writes
(the IR and its weights, OpenVINO, the figures), and ``auto`` timing it only where it passes the
gate (its gate: tests/unit/profiles/test_gates.py). The build through NNCF and serving through
Triton: tests/integration/test_int8_openvino_served.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clip_gateway.config.settings import CPU_PROFILES, PROFILES, RepositorySettings
from clip_gateway.launcher.repository import render
from clip_gateway.model.contract import TEXT_MODEL_NAME, TRITON_MODEL_NAME
from clip_gateway.model.gate import Thresholds
from clip_gateway.profiles import cpu_auto, int8_openvino
from clip_gateway.profiles.choice import FALLBACK
from clip_gateway.profiles.plans import ModelPlan, model_plan
from tests.unit.launcher.test_repository import int8_export, quantization, read
from tests.unit.profiles.test_bf16 import COOPER_LAKE, FIGURES, ZEN3
from tests.unit.profiles.test_cpu_auto import Timer, choose, selection

RUNTIMES = {"openvino": "2026.4.1", "nncf": "3.4.0"}


def built(export: Path, figures: dict[str, object] = FIGURES, rest: str = "bf16") -> Path:
    """An export with a finished OpenVINO INT8 build beside it (empty IR files)."""
    for name in int8_openvino.FILES.values():
        (export / name).write_bytes(b"")
        (export / name.replace(".xml", ".bin")).write_bytes(b"")
    record = {"runtimes": RUNTIMES, "rest": rest, "files": int8_openvino.FILES,
              "figures": figures}  # fmt: skip
    (export / int8_openvino.RECORD).write_text(json.dumps(record))
    return export


def test_it_is_a_cpu_profile_with_openvinos_core_plan_and_falls_back_to_cpu() -> None:
    assert "cpu-int8-openvino" in PROFILES and "cpu-int8-openvino" in CPU_PROFILES
    assert "cpu-int8-openvino" in cpu_auto.CANDIDATES and "nncf" in cpu_auto.RUNTIMES
    assert model_plan("cpu-int8-openvino", 2) == ModelPlan(1, 2)  # not cpu-int8's 2x1
    assert FALLBACK["cpu-int8-openvino"] == "cpu"


def test_the_unquantized_rest_runs_bf16_only_where_the_cpu_has_bf16_units() -> None:
    assert int8_openvino.rest_precision(frozenset(COOPER_LAKE.split())) == "bf16"
    assert int8_openvino.rest_precision(frozenset(ZEN3.split())) == "f32"


def test_a_record_without_its_ir_files_is_no_build(tmp_path: Path) -> None:
    export = built(int8_export(tmp_path / "e"))
    assert int8_openvino.kept(export) is not None
    (export / int8_openvino.FILES["text"]).unlink()
    assert int8_openvino.kept(export) is None


def test_a_kept_build_is_reused_only_for_the_same_runtimes_and_precision(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    export = built(int8_export(tmp_path / "e"))
    builds: list[str] = []

    def build(*args: object, **kwargs: object) -> dict[str, object]:
        builds.append(str(args[4]))
        return dict(FIGURES)

    monkeypatch.setattr(int8_openvino, "versions", lambda python: dict(RUNTIMES))
    monkeypatch.setattr(int8_openvino, "build", build)
    python, script = Path("/nonexistent/python3"), Path("/nonexistent/script.py")
    assert int8_openvino.figures(export, python, script, 1, "bf16")["figures"] == FIGURES
    assert builds == []
    record = int8_openvino.figures(export, python, script, 1, "f32")  # another CPU: built again
    assert builds == ["f32"] and record["rest"] == "f32"
    monkeypatch.setattr(int8_openvino, "versions", lambda python: RUNTIMES | {"nncf": "3.5.0"})
    int8_openvino.figures(export, python, script, 1, "f32")
    assert builds == ["f32", "f32"]


def test_it_renders_the_ir_and_its_weights_on_openvino_with_the_gates_figures(
    tmp_path: Path,
) -> None:
    export = built(int8_export(tmp_path / "e"), rest="bf16")
    gate = Thresholds().as_dict()
    repo = render(RepositorySettings(profile="cpu-int8-openvino"), export, tmp_path / "repo",
                  gate=gate)  # fmt: skip
    for model, kind in ((TRITON_MODEL_NAME, "image"), (TEXT_MODEL_NAME, "text")):
        config = read(repo, model)
        assert config.backend == "python"
        assert config.parameters["runtime"].string_value == "openvino"
        assert config.parameters["inference_precision"].string_value == "bf16"
        name = int8_openvino.FILES[kind]
        assert config.parameters["onnx_file"].string_value == name
        for placed in (name, name.replace(".xml", ".bin")):
            assert (repo / model / "1" / placed).resolve() == (export / placed).resolve()
        value = quantization(config)
        assert (value["precision"], value["runtime"], value["rest"]) == ("int8", "openvino", "bf16")
        assert value["nncf"] == "3.4.0" and value["gate"] == gate
        assert value["cosine_vs_fp32"] == FIGURES[kind]["vs_fp32"]  # type: ignore[index]


def test_it_is_not_rendered_before_it_is_built_nor_on_the_onnxruntime_backend(
    tmp_path: Path,
) -> None:
    export = int8_export(tmp_path / "e")
    with pytest.raises(FileNotFoundError, match="no OpenVINO INT8 build"):
        render(RepositorySettings(profile="cpu-int8-openvino"), export, tmp_path / "repo")
    settings = RepositorySettings(profile="cpu-int8-openvino", cpu_backend="onnxruntime")
    with pytest.raises(ValueError, match="Python backend"):
        render(settings, built(export), tmp_path / "repo")


LOW = {"image": {"vs_fp32": {"mean": 0.97, "min": 0.9, "count": 48}}} | {"text": FIGURES["text"]}


@pytest.mark.parametrize(("figures", "timed"), [(FIGURES, True), (LOW, False)])
def test_auto_times_it_only_where_it_passes_the_gate(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, figures: dict[str, object], timed: bool
) -> None:
    export = int8_export(tmp_path / "e")
    record = {"runtimes": RUNTIMES, "figures": figures}
    monkeypatch.setattr(int8_openvino, "figures", lambda *args, **kwargs: record)
    timer = Timer({"cpu-int8": 40.0, "cpu-int8-openvino": 70.0, "cpu": 20.0})
    chosen = selection(monkeypatch, tmp_path, timer, cpu_backend="python")
    profile, reason = choose(chosen, export)
    assert chosen.profile_choice is not None
    if timed:
        assert timer.timed == ["cpu-int8", "cpu-int8-openvino", "cpu"]
        assert profile == "cpu-int8-openvino"
    else:
        assert timer.timed == ["cpu-int8", "cpu"] and profile == "cpu-int8"
        refused = chosen.profile_choice["refused"]["cpu-int8-openvino"]
        assert refused.startswith("OpenVINO INT8 refused") and "cpu-int8-openvino refused" in reason


def test_auto_on_the_onnxruntime_backend_does_not_build_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def must_not_build(*args: object, **kwargs: object) -> dict[str, object]:
        raise AssertionError("built on the onnxruntime backend")

    monkeypatch.setattr(int8_openvino, "figures", must_not_build)
    timer = Timer({"cpu-int8": 40.0, "cpu": 20.0})
    chosen = selection(monkeypatch, tmp_path, timer, cpu_backend="onnxruntime")
    choose(chosen, int8_export(tmp_path / "e"))
    assert chosen.profile_choice is not None
    assert "Python backend" in chosen.profile_choice["refused"]["cpu-int8-openvino"]
