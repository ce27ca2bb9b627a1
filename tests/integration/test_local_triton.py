"""A real tritonserver (the nvidia-pytriton wheel's) serving the cpu profile over gRPC: the image
model and the text model, each against open_clip."""

from __future__ import annotations

import os
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from clip_gateway.launcher.local import LocalTriton
from clip_gateway.model.contract import (
    CANARY_PARAMETER,
    INPUT_NAME,
    OUTPUT_NAME,
    TEXT_CANARY,
    TEXT_INPUT_NAME,
    TEXT_MODEL_NAME,
    TEXT_OUTPUT_NAME,
    TRITON_MODEL_NAME,
    decode_reference,
)
from clip_gateway.text.tokenizer import ClipBpeTokenizer
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


def infer_text(url: str, ids: np.ndarray) -> np.ndarray:
    with grpcclient.InferenceServerClient(url) as client:
        tensor = grpcclient.InferInput(TEXT_INPUT_NAME, list(ids.shape), "INT32")
        tensor.set_data_from_numpy(ids.astype(np.int32))
        result = client.infer(TEXT_MODEL_NAME, [tensor], client_timeout=60)
        return result.as_numpy(TEXT_OUTPUT_NAME)


def texts(count: int, seed: int) -> list[str]:
    words = ["cat", "dog", "red", "a photo of", "東京", "naïve", "&amp;", "x" * 90, "!", "2024"]
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(words, size=rng.integers(0, 12))) for _ in range(count)]


@pytest.mark.parametrize("batch", [1, 5, 32])
def test_triton_text_matches_open_clip(triton, batch: int) -> None:
    ids = reference.tokens(texts(batch, batch))
    got = infer_text(triton.grpc_url, ids)
    assert got.shape == (batch, 512) and got.dtype == np.float32
    max_abs = float(np.abs(got - reference.embed_tokens(ids)).max())
    print(f"\nclip_text vs encode_text, batch {batch}: max |d| {max_abs:.2e}")
    assert max_abs <= MAX_ABS  # measured 2.9e-6 (batch 1) to 3.8e-6 (batch 32)


def test_text_model_carries_what_the_gateway_needs(triton) -> None:
    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        meta = client.get_model_metadata(TEXT_MODEL_NAME, as_json=True)
        config = client.get_model_config(TEXT_MODEL_NAME, as_json=True)["config"]
    assert [(i["name"], i["datatype"], i["shape"]) for i in meta["inputs"]] == [
        (TEXT_INPUT_NAME, "INT32", ["-1", "77"])
    ]
    assert [(o["name"], o["datatype"], o["shape"]) for o in meta["outputs"]] == [
        (TEXT_OUTPUT_NAME, "FP32", ["-1", "512"])
    ]
    parameters = {k: v["string_value"] for k, v in config["parameters"].items()}
    assert (parameters["tokenizer"], parameters["context_length"]) == ("clip_bpe", "77")
    tokenizer = ClipBpeTokenizer.from_file(
        parameters["tokenizer_file"], int(parameters["context_length"])
    )
    sample = texts(20, 0)
    np.testing.assert_array_equal(tokenizer.tokenize(sample), reference.tokens(sample))
    canary = infer_text(triton.grpc_url, tokenizer.tokenize([TEXT_CANARY]))[0]
    assert np.abs(canary - decode_reference(parameters[CANARY_PARAMETER])).max() <= MAX_ABS


def test_concurrent_text_and_image_requests_each_get_their_own_rows(triton) -> None:
    rng = np.random.default_rng(11)
    jobs = [("text", reference.tokens(texts(n, n))) for n in (1, 3, 2)]
    jobs += [("image", rng.integers(0, 256, (n, 224, 224, 3), dtype=np.uint8)) for n in (2, 1)]

    def run(job: tuple[str, np.ndarray]) -> np.ndarray:
        kind, x = job
        return infer_text(triton.grpc_url, x) if kind == "text" else infer(triton.grpc_url, x)

    with ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(run, jobs))
    for (kind, x), got in zip(jobs, results, strict=True):
        expected = reference.embed_tokens(x) if kind == "text" else reference.embed_pixels(x)
        assert np.abs(got - expected).max() <= MAX_ABS


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


def test_a_killed_tritons_shared_memory_is_removed(cpu_repository, tmp_path) -> None:
    """Triton's Python backend keeps each model instance's messages in /dev/shm regions that only
    a Triton that exits in order removes. One that dies (SIGKILL here; a segfault alike) left
    them until the machine restarted; the launcher removes them when it stops or restarts it."""
    server = LocalTriton(cpu_repository, log_path=tmp_path / "triton.log")
    shm = Path("/dev/shm")
    try:
        server.start()
        assert server.process is not None
        regions = sorted(shm.glob(f"{server.shm_prefix}*"))
        assert regions, "the Python backend's regions carry the server's prefix"
        os.kill(server.process.pid, signal.SIGKILL)  # tritonserver alone, as a crash would
        server.process.wait()
        assert all(region.exists() for region in regions)  # what leaked until now
        server.stop()
        assert not list(shm.glob(f"{server.shm_prefix}*"))
        server.start()  # a restart under the same prefix, as the supervisor does
        assert list(shm.glob(f"{server.shm_prefix}*"))
    finally:
        server.stop()
        server.release_ports()
    assert not list(shm.glob(f"{server.shm_prefix}*"))
