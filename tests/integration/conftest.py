"""Real processes on loopback: the session's gateway in front of the real-model Triton, and a
Triton serving the control model (tests/models/control.py) for failure tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from clip_gateway.config.processes import GatewayProcess
from clip_gateway.launcher.local import LocalTriton
from tests.controlled import Control, render_control_repository


@pytest.fixture(scope="session", autouse=True)
def plans_not_measured() -> Iterator[None]:
    """Every launch here serves the CPU profiles' table plan (or one recorded earlier): a first
    start's background timing of the core plans (a Triton per candidate, up to a minute of both
    cores) would run beside whatever the test checks.
    tests/integration/test_core_plan_first_start.py measures it, with a setting of its own."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GATEWAY_PLAN_MEASURE_S", "0")
        yield


@pytest.fixture(scope="session")
def gateway(triton, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    log = tmp_path_factory.mktemp("gateway") / "gateway.log"
    env = {
        "GATEWAY_MAX_ITEMS_PER_REQUEST": "64",
        "GATEWAY_MAX_BODY_BYTES": str(48 << 20),
        "GATEWAY_MAX_IMAGE_PIXELS": "30000000",
        "GATEWAY_DECODE_THREADS": "2",
        "GATEWAY_TRITON_METRICS_URL": triton.metrics_url,
    }
    # inference calls over Triton's HTTP endpoint, as the launcher sets it up
    with GatewayProcess(triton.grpc_url, env=env, log_path=log,
                        triton_http_url=triton.http_url) as process:  # fmt: skip
        process.wait_ready()
        yield process


@pytest.fixture(scope="session")
def control_triton(
    tmp_path_factory: pytest.TempPathFactory, clip_tokenizer_file: Path
) -> Iterator[tuple[LocalTriton, Control]]:
    """A real tritonserver whose ``clip_image`` and ``clip_text`` are the control model."""
    work = tmp_path_factory.mktemp("control")
    repository, control = render_control_repository(work, clip_tokenizer_file)
    with LocalTriton(repository, log_path=work / "triton.log") as server:
        yield server, control


@pytest.fixture
def control(control_triton: tuple[LocalTriton, Control]) -> Iterator[Control]:
    """The control model, healthy at the start of each test and released at its end."""
    _, knobs = control_triton
    knobs.set()
    yield knobs
    knobs.set()


@pytest.fixture
def start_gateway(tmp_path: Path):
    """Start real gateways with extra settings; all are stopped at the end of the test."""
    started: list[GatewayProcess] = []

    def start(triton_url: str, *, ready: bool = True, **env: str) -> GatewayProcess:
        log = tmp_path / f"gateway-{len(started)}.log"
        process = GatewayProcess(triton_url, env=env, log_path=log).start()
        started.append(process)
        if ready:
            process.wait_ready()
        return process

    yield start
    for process in started:
        process.stop()
