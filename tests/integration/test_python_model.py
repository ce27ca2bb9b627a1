"""triton/python/model.py in a real tritonserver (the cpu profile): the requests Triton's dynamic
batcher merges into one ``execute`` are copied once into the instance's batch buffer and each gets
its own rows back; a batch of one request is read where Triton put it, copied nowhere.

The batcher here forms batches of exactly 6 rows (the only preferred size, a minute's queue
delay), so which requests share an ``execute`` is decided by the test, not by timing: Triton's
own statistics confirm each merge was one execution of 6. The copies are read from the model's
counter on Triton's /metrics (``clip_batch_copied_bytes``, read by bench/harness/triton_side.py
as bench host reads it)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from bench.harness.triton_side import BLOCKING, PINNED, model_metrics
from clip_gateway.config.settings import RepositorySettings
from clip_gateway.launcher.local import LocalTriton
from clip_gateway.launcher.repository import render
from clip_gateway.model.contract import (
    INPUT_NAME,
    OUTPUT_NAME,
    TEXT_INPUT_NAME,
    TEXT_MODEL_NAME,
    TEXT_OUTPUT_NAME,
    TRITON_MODEL_NAME,
)

ROWS = 6
COPIED = "clip_batch_copied_bytes"
IMAGE_ROW_BYTES = 224 * 224 * 3
TEXT_ROW_BYTES = 77 * 4
TOWERS = {  # model: (input, output, Triton datatype, row bytes)
    TRITON_MODEL_NAME: (INPUT_NAME, OUTPUT_NAME, "UINT8", IMAGE_ROW_BYTES),
    TEXT_MODEL_NAME: (TEXT_INPUT_NAME, TEXT_OUTPUT_NAME, "INT32", TEXT_ROW_BYTES),
}


@pytest.fixture(scope="module")
def six_row_triton(exported, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalTriton]:
    work = tmp_path_factory.mktemp("six-rows")
    settings = RepositorySettings(
        profile="cpu", preferred_batch_sizes=(ROWS,), max_queue_delay_us=60_000_000,
        instance_count=1, cpu_threads=1,
    )  # fmt: skip
    repository = render(settings, exported.directory, work / "repository")
    with LocalTriton(repository, log_path=work / "triton.log") as server:
        yield server


def infer(url: str, model: str, rows: np.ndarray) -> np.ndarray:
    name, output, datatype, _ = TOWERS[model]
    with grpcclient.InferenceServerClient(url) as client:
        tensor = grpcclient.InferInput(name, list(rows.shape), datatype)
        tensor.set_data_from_numpy(rows)
        return client.infer(model, [tensor], client_timeout=120).as_numpy(output)


def reported(server: LocalTriton, model: str, name: str, wait_s: float = 30.0) -> float:
    """The model's series ``name`` on Triton's /metrics. A read without it is read again for
    up to ``wait_s`` (CI once read none of the model's series, beside other work: the fetch
    failed or came back without them); still missing, it fails with what the last read found
    and the end of Triton's log."""
    deadline = time.monotonic() + wait_s
    while name not in (found := model_metrics(server.metrics_url, model)):
        if time.monotonic() > deadline:
            log = server.log_path.read_text()[-2000:] if server.log_path else ""
            raise AssertionError(f"no {name} for {model} on {server.metrics_url}: {found}\n{log}")
        time.sleep(0.2)
    return found[name]


def copied_bytes(server: LocalTriton, model: str) -> float:
    """The model's counter of input bytes copied into its batch buffer (every instance)."""
    return reported(server, model, COPIED)


def executions(server: LocalTriton, model: str) -> dict[int, int]:
    """Triton's own count of model executions by batch size."""
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
    return {
        int(row["batch_size"]): int(row["compute_infer"].get("count", 0))
        for row in stats.get("batch_stats", [])
    }


def executed(server: LocalTriton, model: str, sends: list[np.ndarray]) -> list[np.ndarray]:
    """``sends`` sent at once (``ROWS`` rows in all), their answers; checked to be one
    execution of ``ROWS`` rows. No smaller group makes a batch the batcher sends before its
    minute is up, so that execution is all of them."""
    before = executions(server, model)
    with ThreadPoolExecutor(len(sends)) as pool:
        answers = list(pool.map(lambda rows: infer(server.grpc_url, model, rows), sends))
    # Triton records an execution's statistics after its responses are sent: wait for them
    deadline = time.monotonic() + 60
    while (after := executions(server, model)) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    added = {size: n - before.get(size, 0) for size, n in after.items() if n != before.get(size)}
    assert added == {ROWS: 1}  # one execute for them all, nothing else
    return answers


def rows(model: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if model == TRITON_MODEL_NAME:
        return rng.integers(0, 256, (ROWS, 224, 224, 3), dtype=np.uint8)
    return rng.integers(1, 49407, (ROWS, 77), dtype=np.int32)


@pytest.mark.parametrize("model", [TRITON_MODEL_NAME, TEXT_MODEL_NAME])
def test_merged_requests_are_copied_once_and_each_gets_its_own_rows(
    six_row_triton: LocalTriton, model: str
) -> None:
    row_bytes = TOWERS[model][3]
    for seed, sizes in ((1, (1, 2, 3)), (2, (4, 1, 1)), (3, (2, 4))):
        batch = rows(model, seed)
        # the same six rows as one request: one execution of 6 read where Triton put them
        copied = copied_bytes(six_row_triton, model)
        (whole,) = executed(six_row_triton, model, [batch])
        assert copied_bytes(six_row_triton, model) == copied
        # and as requests the batcher merges: one copy of each row into the buffer, reused
        # by every merge (the earlier seeds' rows are overwritten, none left behind)
        edges = np.cumsum((0, *sizes))
        parts = [batch[a:b] for a, b in itertools.pairwise(edges)]
        answers = executed(six_row_triton, model, parts)
        assert copied_bytes(six_row_triton, model) == copied + ROWS * row_bytes
        for part, answer in zip(parts, answers, strict=True):
            assert answer.shape == (len(part), 512) and answer.dtype == np.float32
        # the same batch in the same order through the same graph: the same bits, row by row
        np.testing.assert_array_equal(np.concatenate(answers), whole)
        assert len({row.tobytes() for row in whole}) == ROWS  # rows that tell requests apart


def test_the_cpu_ep_says_its_buffer_is_not_page_locked(six_row_triton: LocalTriton) -> None:
    """Page-locking and the context's blocking sync are the CUDA EP's (its host-to-device DMA,
    its waits for the GPU): on the CPU EP each tower's instance reports 0 for both on Triton's
    /metrics, and never asked the CUDA driver for anything."""
    for model in TOWERS:
        assert reported(six_row_triton, model, PINNED) == 0.0
        assert reported(six_row_triton, model, BLOCKING) == 0.0
    assert six_row_triton.log_path is not None
    log = six_row_triton.log_path.read_text()
    assert "CUDA context" not in log and "libcuda" not in log
