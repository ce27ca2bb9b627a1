"""The decode threads, shared fairly between requests: start-time fair queuing over priced work.

A plain thread pool runs tasks in arrival order, so one request of 32 heavy images (each priced,
admitted and within its key's share) put every other client's small photo behind all 32 of its
decodes: seconds of wait for a decode of milliseconds (the bench's attacks study, issue 31's
classes at 32 per request). Here each request is a *flow* and each task carries its priced
seconds: a task's start tag is ``max(V, the flow's last finish tag)`` and its finish tag the start
plus its cost, where V is the start tag of the task most recently started (Goyal et al.,
start-time fair queuing). The idle thread takes the smallest start tag, so a request that just
arrived goes next to the task in service, and a flow with many queued tasks takes its turn
among the others in proportion to the work each was priced at. Nothing is preempted: a decode
that runs long is bounded by the decoder's own limits and the request's meter (batching.py).
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class Flow:
    """One request's tasks: its finish tag (virtual seconds of priced work so far)."""

    __slots__ = ("finish",)

    def __init__(self) -> None:
        self.finish = 0.0


#: Tasks submitted without a flow (the memory trimmer, text tokenising): one shared flow, each
#: task a millisecond of work.
_DEFAULT_COST = 1e-3


class FairExecutor(Executor):
    """``threads`` threads serving tasks in start-tag order; ``submit_to(flow, cost, fn, ...)``
    queues ``fn`` as ``cost`` priced seconds of ``flow``; plain ``submit`` uses a shared flow."""

    def __init__(self, threads: int, thread_name_prefix: str = "decode") -> None:
        self._queue: list[tuple[float, int, Future[Any], Callable[[], Any]]] = []
        self._ready = threading.Condition()
        self._order = itertools.count()
        self._virtual = 0.0
        self._shared = Flow()
        self._closed = False
        self._threads = [
            threading.Thread(target=self._serve, name=f"{thread_name_prefix}_{i}", daemon=True)
            for i in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        return self.submit_to(self._shared, _DEFAULT_COST, fn, *args, **kwargs)

    def submit_to(
        self, flow: Flow, cost: float, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
    ) -> Future[T]:
        future: Future[T] = Future()
        with self._ready:
            if self._closed:
                raise RuntimeError("cannot schedule new work after shutdown")
            start = max(self._virtual, flow.finish)
            flow.finish = start + max(cost, 0.0)
            heapq.heappush(
                self._queue, (start, next(self._order), future, lambda: fn(*args, **kwargs))
            )
            self._ready.notify()
        return future

    def _serve(self) -> None:
        while True:
            with self._ready:
                while not self._queue and not self._closed:
                    self._ready.wait()
                if not self._queue:
                    return  # closed and drained
                start, _, future, call = heapq.heappop(self._queue)
                self._virtual = max(self._virtual, start)
            if future.set_running_or_notify_cancel():  # else cancelled while queued
                try:
                    future.set_result(call())
                except BaseException as exc:  # handed to whoever waits on the future
                    future.set_exception(exc)
            # nothing of the task stays referenced by this idle thread (the call's closure holds
            # the request's images and the batch it decoded into), as ThreadPoolExecutor's
            # workers drop their work item
            del future, call

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._ready:
            self._closed = True
            if cancel_futures:
                for _, _, future, _ in self._queue:
                    future.cancel()
                self._queue = [entry for entry in self._queue if not entry[2].cancelled()]
            self._ready.notify_all()
        if wait:
            for thread in self._threads:
                if thread is not threading.current_thread():
                    thread.join()

    @property
    def threads(self) -> int:
        """The threads serving tasks."""
        return len(self._threads)

    def queued(self) -> int:
        """Tasks waiting for a thread (not those running)."""
        with self._ready:
            return len(self._queue)
