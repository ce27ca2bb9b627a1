"""A real gateway process in front of the session's real tritonserver."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway.launch import GatewayProcess


@pytest.fixture(scope="session")
def gateway(triton, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    log = tmp_path_factory.mktemp("gateway") / "gateway.log"
    env = {
        "GATEWAY_MAX_IMAGES_PER_REQUEST": "64",
        "GATEWAY_MAX_BODY_BYTES": str(48 << 20),
        "GATEWAY_MAX_IMAGE_PIXELS": "30000000",
        "GATEWAY_DECODE_THREADS": "2",
    }
    with GatewayProcess(triton.grpc_url, env=env, log_path=log) as process:
        process.wait_ready()
        yield process
