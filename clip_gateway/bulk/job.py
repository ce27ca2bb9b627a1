"""The driver: the plan (made once, kept in the output), the shards not yet committed handed
to a fixed pool of ``ShardWorker`` Ray actors (one shard in hand each; Ray restarts a worker
that dies and hands it its shard again), progress, and the summary.

Why the shard as the unit, and not Ray Data's file readers feeding a map: a reader's blocks
mix and split files as Ray sees fit, so nothing downstream knows when every item of an input
shard has passed (only a shuffle at the very end would), and a job killed at 90 % would keep
nothing. With the shard as the unit, each worker reads its shard as a stream, and commits it
whole. And why Ray's actors and not Ray Data's actor pool over one row per shard, as the job
first ran: that pool is all the job used of Ray Data, and it came with three actors of Ray
Data's own (stats, autoscaling, actor locations) and a scheduling loop in the driver, each
spending CPU every second and all of them started before the first shard (docs/BULK.md has the
figures).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from clip_gateway.bulk import output, sources
from clip_gateway.bulk.work import JobSpec, ShardResult, ShardWorker

#: Environment passed on to Ray's workers: object storage credentials and endpoint.
FORWARDED_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "CLIP_GATEWAY_API_KEY",
)


class PlanMismatch(ValueError):
    """The output folder holds another job's plan (another source, format or dtype)."""


@dataclass(frozen=True)
class RayOptions:
    #: Join this cluster (``ray://...`` or ``auto``); None: start a local Ray here.
    address: str | None = None
    workers: int = 2
    #: CPUs reserved by each worker (reading, compacting and parsing answers).
    worker_cpus: float = 1.0
    #: A local Ray's CPUs and object store (None: Ray's defaults).
    num_cpus: int | None = None
    object_store_bytes: int | None = None


@dataclass
class Summary:
    shards: int = 0
    skipped: int = 0  # committed by an earlier run
    committed: int = 0  # by this run
    rows: int = 0  # this run
    failures: Counter[str] = field(default_factory=Counter)  # this run, by reason
    bytes_read: int = 0
    seconds: float = 0.0
    errors: dict[str, str] = field(default_factory=dict)  # shards left, and why
    total_rows: int = 0  # the whole job, every run
    total_failures: int = 0

    @property
    def complete(self) -> bool:
        return not self.errors and self.skipped + self.committed == self.shards

    def lines(self) -> list[str]:
        rate = self.rows / self.seconds if self.seconds else 0.0
        failed = ", ".join(f"{kind}: {n}" for kind, n in sorted(self.failures.items()))
        lines = [f"shard {name} not done: {why}" for name, why in sorted(self.errors.items())]
        lines.append(
            f"{self.committed} shards written, {self.skipped} done before, "
            f"{self.shards - self.committed - self.skipped} left; this run: {self.rows} images "
            f"embedded, {sum(self.failures.values())} failed"
            + (f" ({failed})" if failed else "")
            + f", {self.bytes_read / 1e6:.1f} MB read in {self.seconds:.1f} s, {rate:.1f} images/s"
        )
        lines.append(f"the job: {self.total_rows} rows, {self.total_failures} failures")
        return lines


def load_plan(spec: JobSpec, shard_size: int) -> list[sources.Shard]:
    """The job's shards: from the output's plan when a run made one, else made and saved."""
    out = output.Output.at(spec.output, spec.output_options)
    fixed = {
        "source": spec.source.url,
        "format": spec.source.format,
        "dtype": spec.dtype,
        "columns": asdict(spec.source.columns),
    }
    saved = out.read_json(output.PLAN)
    if saved is not None:
        differs = {k: (saved.get(k), v) for k, v in fixed.items() if saved.get(k) != v}
        if differs:
            said = "; ".join(
                f"{k}: {old!r} there, {new!r} here" for k, (old, new) in differs.items()
            )
            raise PlanMismatch(f"{spec.output} holds another job ({said}); use another output")
        return [sources.Shard.from_json(s) for s in saved["shards"]]
    shards = sources.plan(spec.source, shard_size)
    captions = spec.captions and sources.has_captions(spec.source, shards[0])
    out.write_json(
        output.PLAN, {**fixed, "captions": captions, "shards": [s.to_json() for s in shards]}
    )
    return shards


def captions_of(spec: JobSpec) -> bool:
    saved = output.Output.at(spec.output, spec.output_options).read_json(output.PLAN)
    return bool(saved and saved.get("captions"))


def run(
    spec: JobSpec,
    ray_options: RayOptions,
    *,
    shard_size: int = 10_000,
    progress: Callable[[dict[str, int]], None] | None = None,
) -> Summary:
    """The job to the end of its shards; ``progress`` (None: nobody watches) is called with the
    counts so far twice a second, from a thread of its own."""
    started = time.monotonic()
    shards = load_plan(spec, shard_size)
    spec = replace(spec, captions=captions_of(spec))
    out = output.Output.at(spec.output, spec.output_options)
    out.sweep()
    done = out.done()
    pending = [s for s in shards if s.name not in done]
    summary = Summary(shards=len(shards), skipped=len(shards) - len(pending))
    if pending:
        _run_on_ray(spec, ray_options, pending, summary, progress)
    summary.seconds = time.monotonic() - started
    for record in out.done().values():
        summary.total_rows += int(record["rows"])
        summary.total_failures += sum(record["failures"].values())
    return summary


def _run_on_ray(
    spec: JobSpec,
    options: RayOptions,
    pending: list[sources.Shard],
    summary: Summary,
    progress: Callable[[dict[str, int]], None] | None,
) -> None:
    import ray

    env = {name: os.environ[name] for name in FORWARDED_ENV if name in os.environ}
    init: dict[str, Any] = {
        "runtime_env": {"env_vars": env},
        "logging_level": logging.WARNING,
        "log_to_driver": True,
        "include_dashboard": False,
    }
    if options.address is None:
        init |= {"num_cpus": options.num_cpus, "object_store_memory": options.object_store_bytes}
    else:
        init["address"] = options.address
    ray.init(**init)
    try:
        # the workers' counts as they go, for progress bars: an actor (a process of its own,
        # a Ray worker to start) only when someone watches them
        tally = ray.remote(num_cpus=0)(Tally).remote() if progress is not None else None
        # no more workers than shards, and the job's requests in flight per gateway shared by
        # the workers there are (each has at least one)
        count = min(options.workers, len(pending))
        share = replace(
            spec, fleet=replace(spec.fleet, in_flight=max(1, spec.fleet.in_flight // count))
        )
        # a worker whose process dies is started again, and its shard given to it again (a
        # shard is committed whole or not at all, so a shard done twice is written once)
        worker = ray.remote(ShardWorker).options(
            num_cpus=options.worker_cpus, max_restarts=-1, max_task_retries=-1
        )
        workers = [worker.remote(share, tally) for _ in range(count)]
        stop = threading.Event()
        watcher = threading.Thread(
            target=_watch, args=(tally, stop, progress, summary), daemon=True
        )
        if progress is not None:
            watcher.start()
        try:
            for result in _through(workers, pending):
                if result.error:
                    summary.errors[result.name] = result.error
                    continue
                summary.committed += 1
                summary.rows += result.rows
                summary.failures.update(result.failures)
                summary.bytes_read += result.bytes_read
        finally:
            if progress is not None:
                stop.set()
                watcher.join()
                _report(tally, progress, summary)  # the bars' last state: every shard counted
    finally:
        ray.shutdown()


def _through(workers: list[Any], shards: list[sources.Shard]) -> Iterator[ShardResult]:
    """Each shard's result as it ends, each worker given the next shard as it hands one back:
    one shard in hand per worker, so that the last shards go to whichever workers are free."""
    import ray

    queue = deque(shards)
    running: dict[Any, Any] = {}
    for worker in workers:
        if queue:
            running[worker.run.remote(queue.popleft())] = worker
    while running:
        (ready,), _ = ray.wait(list(running), num_returns=1)
        worker = running.pop(ready)
        if queue:
            running[worker.run.remote(queue.popleft())] = worker
        yield ray.get(ready)


def _watch(
    tally: Any, stop: threading.Event, progress: Callable[[dict[str, int]], None], summary: Summary
) -> None:
    while not stop.wait(0.5):
        _report(tally, progress, summary)


def _report(tally: Any, progress: Callable[[dict[str, int]], None], summary: Summary) -> None:
    import ray

    try:
        counts: dict[str, int] = ray.get(tally.read.remote(), timeout=5)
    except Exception:  # the progress bars are best effort; the job goes on without them
        return
    shards = summary.committed + summary.skipped
    progress({**counts, "shards": shards, "shards_total": summary.shards})


class Tally:
    """A Ray actor the workers report to as they go, for the driver's progress bars."""

    def __init__(self) -> None:
        self.counts = {"rows": 0, "failed": 0, "bytes": 0}

    def add(self, rows: int, failed: int, read: int) -> None:
        self.counts["rows"] += rows
        self.counts["failed"] += failed
        self.counts["bytes"] += read

    def read(self) -> dict[str, int]:
        return dict(self.counts)
