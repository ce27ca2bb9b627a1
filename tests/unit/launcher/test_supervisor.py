"""The supervisor's own steps with Triton's start and reload replaced: an automatically chosen
profile that does not load gives way to the profiles' fallback within the start-up budget (an
operator's choice, or one with no budget left, fails as it is); what is measured after ready is
loaded into the serving Triton in place, a model that does not load put back, and a measurement
that fails leaves what serves. The launch path itself is tests/integration/test_supervisor.py's."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest

from clip_gateway.config.processes import ProcessStartError
from clip_gateway.config.settings import Profile, RepositorySettings, Settings
from clip_gateway.launcher.local import TritonInstall
from clip_gateway.launcher.supervisor import Supervisor
from clip_gateway.model.contract import QUANTIZATION_PARAMETER, TEXT_MODEL_NAME, TRITON_MODEL_NAME
from clip_gateway.profiles import bf16, cpu_auto
from clip_gateway.profiles.choice import Serving
from clip_gateway.profiles.gates import Verdict
from tests.unit.launcher.test_repository import int8_export, read
from tests.unit.profiles.test_bf16 import ZEN3
from tests.unit.profiles.test_cpu_auto import Timer, must_not_measure, settings


class Starts(Supervisor):
    """Records the profiles Triton was started with; ``fails`` do not load."""

    def __init__(self, profile: str, fails: set[str]) -> None:
        super().__init__(Settings.from_env(repository={"profile": profile}))
        self.fails = fails
        self.tried: list[str] = []

    def start_triton(self, serving: Serving, deadline: float) -> None:
        self.tried.append(serving.profile)
        if serving.profile in self.fails:
            raise ProcessStartError("tritonserver model READY: the process exited\n(log)")


def start(supervisor: Starts, profile: Profile, deadline: float = math.inf) -> tuple[str, str]:
    repository = RepositorySettings(profile=profile)
    serving = Serving(profile, "chosen", Path("."), profile, repository, {})
    ran = supervisor.start_model(serving, deadline)
    return ran.profile, ran.reason


def test_automatic_tensorrt_that_does_not_load_falls_back_to_cuda() -> None:
    supervisor = Starts("auto", fails={"tensorrt"})
    profile, reason = start(supervisor, "tensorrt")
    assert (profile, supervisor.tried) == ("cuda", ["tensorrt", "cuda"])
    assert reason == "tensorrt did not load: tritonserver model READY: the process exited"


def test_an_explicit_profile_never_falls_back() -> None:
    supervisor = Starts("tensorrt", fails={"tensorrt"})
    with pytest.raises(ProcessStartError):
        start(supervisor, "tensorrt")
    assert supervisor.tried == ["tensorrt"]


def test_no_fallback_once_the_budget_is_spent_or_for_cuda() -> None:
    spent = Starts("auto", fails={"tensorrt"})
    with pytest.raises(ProcessStartError):
        start(spent, "tensorrt", deadline=time.monotonic() - 1)
    assert spent.tried == ["tensorrt"]
    cuda = Starts("auto", fails={"cuda"})
    with pytest.raises(ProcessStartError):
        start(cuda, "cuda")  # the CUDA EP runs any graph ORT can: nothing below it on a GPU
    assert cuda.tried == ["cuda"]


def test_a_profile_that_loads_is_kept() -> None:
    supervisor = Starts("auto", fails=set())
    assert start(supervisor, "tensorrt") == ("tensorrt", "chosen")
    assert supervisor.tried == ["tensorrt"]


class Reloading:
    """The serving Triton's in-place reload, as a seam: records each model loaded again with
    the precision its config then had, and refuses the models named in ``refuse``."""

    def __init__(self, repository: Path) -> None:
        self.repository = repository
        self.refuse: set[str] = set()
        self.loaded: list[tuple[str, object]] = []

    def reload(self, model: str, timeout: float) -> None:
        assert timeout > 0
        if model in self.refuse:
            raise ProcessStartError(f"Triton did not load {model} again: refused here")
        config = read(self.repository, model)
        for parameter in config.parameters.values():  # every file it names is there
            if parameter.string_value.startswith("/"):
                assert Path(parameter.string_value).is_file(), parameter.string_value
        self.loaded.append((model, precision(self.repository, model)))


def precision(repository: Path, model: str) -> object:
    value = read(repository, model).parameters[QUANTIZATION_PARAMETER].string_value
    return json.loads(value)["precision"] if value else "fp32"


def serving(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, timer: cpu_auto.Timer, profile: Profile = "cpu"
) -> tuple[Supervisor, Serving, Reloading]:
    """``auto``'s first start on a CPU host: Triton serves ``profile`` from a rendered
    repository (no Triton env: a backends folder of this test's), reloads recorded."""
    monkeypatch.setattr(bf16, "cpu_flags", lambda: frozenset(ZEN3.split()))
    export = int8_export(tmp_path / "e")
    supervisor = Supervisor(settings(tmp_path, cpu_backend="python"),
                            progress=lambda line: None, cpu_timer=timer)  # fmt: skip
    (tmp_path / "backends" / "python").mkdir(parents=True)
    nowhere = Path("/nonexistent")
    supervisor.host.install = TritonInstall(nowhere / "tritonserver", tmp_path / "backends",
                                            python_bin_dir=nowhere / "bin")  # fmt: skip
    monkeypatch.setattr(supervisor.host, "export", lambda *, int8: export)
    supervisor.selection.identity = "model-identity"
    supervisor.selection.choose_later = True
    supervisor.scratch = tmp_path / "scratch"
    served = supervisor.selection.answer(profile, "auto, first start here", export, math.inf)
    live = supervisor.render(served, supervisor.scratch / "model_repository")
    triton = Reloading(live)
    supervisor.triton = triton  # type: ignore[assignment]
    return supervisor, served, triton


def test_the_fastest_is_loaded_in_place_and_a_model_that_does_not_load_is_put_back(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    supervisor, cpu, triton = serving(monkeypatch, tmp_path, must_not_measure)
    assert supervisor.scratch is not None
    int8 = supervisor.selection.answer("cpu-int8", "measured", cpu.export_dir, math.inf)
    supervisor.switch_to(int8, math.inf)
    assert triton.loaded == [(TRITON_MODEL_NAME, "int8"), (TEXT_MODEL_NAME, "int8")]
    assert [p.name for p in supervisor.scratch.iterdir()] == ["model_repository"]
    triton.refuse = {TEXT_MODEL_NAME}
    with pytest.raises(ProcessStartError, match="did not load"):
        supervisor.switch_to(cpu, math.inf)
    # the image tower was loaded again; the text tower's old files serve on, in place
    assert precision(triton.repository, TRITON_MODEL_NAME) == "fp32"
    assert precision(triton.repository, TEXT_MODEL_NAME) == "int8"
    assert [p.name for p in supervisor.scratch.iterdir()] == ["model_repository"]


def test_the_background_measurement_switches_to_the_fastest_and_keeps_the_choice(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    timer = Timer({"cpu-int8": 40.0, "cpu-int8-openvino": 10.0, "cpu": 100.0})
    supervisor, int8, triton = serving(monkeypatch, tmp_path, timer, "cpu-int8")
    lines: list[str] = []
    supervisor.progress = lines.append
    openvino = supervisor.selection.gates["cpu-int8-openvino"]
    monkeypatch.setattr(openvino, "check", lambda *args: Verdict(None))  # built, and passed
    exported: list[bool] = []

    def export(*, int8: bool) -> Path:
        exported.append(int8)  # the fresh start's export has no INT8 files: made now
        return export_dir

    export_dir = int8.export_dir
    monkeypatch.setattr(supervisor.host, "export", export)
    supervisor.switch_later(int8)
    assert exported == [True]
    assert timer.timed == ["cpu-int8", "cpu-int8-openvino", "cpu"]
    assert triton.loaded == [(TRITON_MODEL_NAME, "fp32"), (TEXT_MODEL_NAME, "fp32")]
    config = read(triton.repository, TRITON_MODEL_NAME)
    shown = json.loads(config.parameters[QUANTIZATION_PARAMETER].string_value)
    assert shown["profile_choice"]["chosen"] == "cpu"
    assert "auto: Triton cpu profile (auto, measured now" in lines[-1]
    assert lines[-1].endswith("replaces cpu-int8, loaded in place")
    assert json.loads((export_dir / cpu_auto.RECORD).read_text())["profile"] == "cpu"
    # measured, so the next start serves the choice at once
    (tmp_path / "again").mkdir()
    again, _, _ = serving(monkeypatch, tmp_path / "again", must_not_measure)
    assert again.selection.recorded_choice(export_dir) is not None


def test_a_failed_background_measurement_leaves_what_serves(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    supervisor, int8, triton = serving(monkeypatch, tmp_path, Timer({}), "cpu-int8")

    def broken(*args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(supervisor.selection, "race", broken)
    supervisor.switch_later(int8)
    assert triton.loaded == []
    assert "cpu-int8 goes on serving" in caplog.text and "disk full" in caplog.text
