"""The driver's settings of Ray Data (clip_gateway/bulk/job.py)."""

from __future__ import annotations

import inspect

import pytest

from clip_gateway.bulk import job


@pytest.mark.slow  # importing Ray Data: ~3 s
def test_ray_datas_scheduling_loop_is_told_to_wait_a_second_for_a_shard() -> None:
    """The constant the job raises is the one the pinned Ray's scheduling loop reads at each
    wait: a Ray upgrade that moves or renames it fails here, instead of quietly waking the
    driver ten times a second again."""
    state = pytest.importorskip("ray.data._internal.execution.streaming_executor_state")
    assert "timeout=WAIT_FOR_TASK_COMPLETION_TIMEOUT_S" in inspect.getsource(
        state.process_completed_tasks
    )
    before = state.WAIT_FOR_TASK_COMPLETION_TIMEOUT_S
    assert before < job.SCHEDULING_WAIT_S  # Ray's own: 0.1 s
    try:
        job._slower_scheduling_loop()
        assert state.WAIT_FOR_TASK_COMPLETION_TIMEOUT_S == job.SCHEDULING_WAIT_S == 1.0
    finally:
        state.WAIT_FOR_TASK_COMPLETION_TIMEOUT_S = before
