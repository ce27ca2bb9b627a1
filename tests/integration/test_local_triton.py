"""A real tritonserver (the nvidia-pytriton wheel's) serving the cpu profile over gRPC."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from gateway.backend.contract import INPUT_NAME, OUTPUT_NAME, TRITON_MODEL_NAME
from gateway.backend.local import LocalTriton
from tests import reference

#: Triton's answer vs open_clip's model on the same uint8 pixels (tests/reference.py); the
#: export's parity check measured max |d| 3.1e-6.
MAX_ABS = 1e-4


def infer(url: str, pixels: np.ndarray) -> np.ndarray:
    with grpcclient.InferenceServerClient(url) as client:
        tensor = grpcclient.InferInput(INPUT_NAME, list(pixels.shape), "UINT8")
        tensor.set_data_from_numpy(pixels)
        result = client.infer(TRITON_MODEL_NAME, [tensor], client_timeout=60)
        return result.as_numpy(OUTPUT_NAME)


@pytest.mark.parametrize("batch", [1, 7, 32])
def test_triton_matches_open_clip(triton, batch: int) -> None:
    pixels = np.random.default_rng(batch).integers(0, 256, (batch, 224, 224, 3), dtype=np.uint8)
    got = infer(triton.grpc_url, pixels)
    assert got.shape == (batch, 512) and got.dtype == np.float32
    assert np.abs(got - reference.embed_pixels(pixels)).max() <= MAX_ABS


def test_concurrent_requests_are_batched_and_each_gets_its_own_rows(triton) -> None:
    rng = np.random.default_rng(7)
    batches = [rng.integers(0, 256, (n, 224, 224, 3), dtype=np.uint8) for n in (1, 2, 3, 1, 4, 2)]
    with ThreadPoolExecutor(len(batches)) as pool:
        results = list(pool.map(lambda b: infer(triton.grpc_url, b), batches))
    for pixels, got in zip(batches, results, strict=True):
        assert np.abs(got - reference.embed_pixels(pixels)).max() <= MAX_ABS


def test_model_metadata_matches_contract(triton) -> None:
    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        meta = client.get_model_metadata(TRITON_MODEL_NAME, as_json=True)
        config = client.get_model_config(TRITON_MODEL_NAME, as_json=True)["config"]
    assert [(i["name"], i["datatype"], i["shape"]) for i in meta["inputs"]] == [
        (INPUT_NAME, "UINT8", ["-1", "224", "224", "3"])
    ]
    assert [(o["name"], o["datatype"]) for o in meta["outputs"]] == [(OUTPUT_NAME, "FP32")]
    assert config["dynamic_batching"]["preferred_batch_size"] == [4, 8, 16, 32]


def test_launcher_binds_loopback_only_and_stops_cleanly(cpu_repository, tmp_path) -> None:
    server = LocalTriton(cpu_repository, log_path=tmp_path / "triton.log")
    command = server.command()
    for flag in (
        "--grpc-address=127.0.0.1",
        "--http-address=127.0.0.1",
        "--metrics-address=127.0.0.1",
    ):
        assert flag in command
    assert "--model-control-mode=none" in command
    with server:
        assert server.ready_seconds is not None
        print(f"\ntritonserver start to READY: {server.ready_seconds:.2f} s")
        process = server.process
        assert process is not None and process.poll() is None
    assert process.returncode == 0
    assert "Waiting for in-flight requests to complete" in (tmp_path / "triton.log").read_text()
