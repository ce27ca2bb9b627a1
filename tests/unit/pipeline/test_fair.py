"""The decode threads' fair queue (pipeline/fair.py): a request that arrives while another's
many images wait goes next, each flow takes turns by its priced work, cancelled tasks never run,
and errors reach whoever waits."""

from __future__ import annotations

import threading

import pytest

from clip_gateway.pipeline.fair import FairExecutor, Flow


def _held(executor: FairExecutor) -> threading.Event:
    """The executor's one thread busy until the returned event is set."""
    release, running = threading.Event(), threading.Event()

    def block() -> None:
        running.set()
        release.wait(10)

    executor.submit(block)
    assert running.wait(10)
    return release


def test_a_new_request_goes_next_not_behind_every_queued_image() -> None:
    executor = FairExecutor(1)
    order: list[str] = []
    release = _held(executor)
    heavy, light = Flow(), Flow()
    futures = [executor.submit_to(heavy, 0.2, order.append, f"heavy{i}") for i in range(5)]
    futures.append(executor.submit_to(light, 0.002, order.append, "light"))
    release.set()
    for future in futures:
        future.result(10)
    assert order == ["heavy0", "light", "heavy1", "heavy2", "heavy3", "heavy4"]
    executor.shutdown()


def test_flows_take_turns_in_proportion_to_their_priced_work() -> None:
    executor = FairExecutor(1)
    order: list[str] = []
    release = _held(executor)
    big, small = Flow(), Flow()
    futures = [executor.submit_to(big, 2.0, order.append, f"big{i}") for i in range(3)]
    futures += [executor.submit_to(small, 1.0, order.append, f"small{i}") for i in range(6)]
    release.set()
    for future in futures:
        future.result(10)
    # start tags: big 0, 2, 4; small 0, 1, 2, 3, 4, 5 (ties in arrival order)
    assert order == ["big0", "small0", "small1", "big1", "small2", "small3", "big2", "small4",
                     "small5"]  # fmt: skip
    executor.shutdown()


def test_cancelled_tasks_never_run_and_errors_reach_the_caller() -> None:
    executor = FairExecutor(1)
    ran: list[int] = []
    release = _held(executor)
    flow = Flow()
    kept = executor.submit_to(flow, 1.0, ran.append, 1)
    dropped = executor.submit_to(flow, 1.0, ran.append, 2)
    assert dropped.cancel()
    failing = executor.submit_to(flow, 1.0, lambda: 1 / 0)
    release.set()
    kept.result(10)
    with pytest.raises(ZeroDivisionError):
        failing.result(10)
    assert ran == [1]
    executor.shutdown()


def test_shutdown_cancels_what_waits_and_refuses_more() -> None:
    executor = FairExecutor(2)
    release = _held(executor)
    second = _held(executor)
    queued = executor.submit_to(Flow(), 1.0, lambda: None)
    release.set()
    second.set()
    executor.shutdown(wait=True, cancel_futures=True)
    assert queued.cancelled() or queued.done()
    with pytest.raises(RuntimeError, match="after shutdown"):
        executor.submit(lambda: None)
