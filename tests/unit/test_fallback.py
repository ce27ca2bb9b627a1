"""The supervisor's profile fallback (Supervisor.start_model), with Triton's start replaced: an
automatically chosen tensorrt that does not load gives way to cuda within the start-up budget;
an operator's choice, or a fallback with no budget left, fails as it is."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from clip_gateway.config.processes import ProcessStartError
from clip_gateway.config.settings import RepositorySettings, Settings
from clip_gateway.launcher.supervisor import Supervisor


class Starts(Supervisor):
    """Records the profiles Triton was started with; ``fails`` do not load."""

    def __init__(self, profile: str, fails: set[str]) -> None:
        super().__init__(Settings.from_env(repository={"profile": profile}))
        self.fails = fails
        self.tried: list[str] = []

    def start_triton(
        self, repository: RepositorySettings, export_dir: Path, deadline: float
    ) -> None:
        self.tried.append(repository.profile)
        if repository.profile in self.fails:
            raise ProcessStartError("tritonserver model READY: the process exited\n(log)")


def start(supervisor: Starts, profile: str, deadline: float = math.inf) -> tuple[str, str]:
    repository = RepositorySettings(profile=profile)  # type: ignore[arg-type]
    return supervisor.start_model(repository, Path("."), profile, "chosen", deadline)  # type: ignore[arg-type]


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
