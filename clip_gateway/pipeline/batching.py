"""A request's images decoded in the thread pool into one uint8 batch, with spans and metrics,
each decode metered in the thread that runs it (``Meter``): a request that has spent more than
its budget decodes nothing more."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import logging
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import numpy as np
from opentelemetry.trace import Span, Tracer
from PIL import Image

from clip_gateway.errors import EmbeddingError, InvalidImage, Overspent
from clip_gateway.imaging.preprocess import Decoded, DecodeOptions, preprocess
from clip_gateway.imaging.work import Work
from clip_gateway.model.calibration import photo
from clip_gateway.observability.metrics import Metrics
from clip_gateway.observability.tracing import record_span
from clip_gateway.pipeline.cputime import own_cpu_s, watch_collections
from clip_gateway.pipeline.fair import FairExecutor, Flow
from clip_gateway.pipeline.items import ImageItem, item_bytes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DecodedBatch:
    pixels: np.ndarray  # uint8 [n_ok, S, S, 3]
    indices: tuple[int, ...]  # the request index of each row
    rows: tuple[int, ...]  # the row of ``out`` (the batch decoded into) each one came from
    image_facts: tuple[Decoded, ...]  # what each row's image was (format, size)
    errors: tuple[EmbeddingError, ...]  # per-item failures (skip mode), each with its index


@dataclass(frozen=True)
class DecodeSample:
    """Decodes of one coding in one batch: what admission learns its decode rate from."""

    coding: str
    cpu_seconds: float
    priced_s: float  # their header price (imaging/work.py)
    items: int


#: Told after each batch: the samples per format, the encoded bytes and the decoded pixels (the
#: trimmer's measure of churned memory; -1 pixels: a batch with failures, trim when allowed).
OnDecoded = Callable[[Sequence[DecodeSample], int, int], None]


@dataclass(frozen=True)
class _Timed:
    decoded: Decoded
    start_ns: int
    end_ns: int
    #: The decode's thread CPU time: what the meter counts and admission learns from (wall
    #: time would count the other thread and the event loop taking this core).
    cpu_s: float = 0.0


class Meter:
    """One request's decode spending, added by the worker threads as each decode ends (thread
    CPU time: what the input made the decoder do, whatever else runs). Once it has spent more
    than ``budget_s``, the decodes not yet started are not started."""

    def __init__(self, priced_s: float, budget_s: float) -> None:
        #: The CPU seconds its images were priced at, and what it may spend.
        self.priced_s = priced_s
        self.budget_s = budget_s
        self.spent_s = 0.0
        self._lock = threading.Lock()

    def spend(self, seconds: float) -> None:
        with self._lock:
            self.spent_s += seconds

    @property
    def over(self) -> bool:
        return self.spent_s > self.budget_s


#: A decode not started: its request had spent its budget.
_NOT_STARTED = object()


class RowWrites:
    """How a JPEG that is already the model's input (the client's centre squares) reaches its
    batch row, chosen by measuring both ways in this process's decode threads, on its own
    requests: libjpeg writing the row itself, or a decode into an array of its own and a copy.
    Neither is assumed: on a 2-core AMD EPYC VM writing the row saved ~12 % of the decode
    thread's CPU per square (2026-12-01), on a 2-core Xeon it cost ~20 % more (cold rows,
    2026-11-29). The first ``WARMUP`` such images do not count (a new process's first batches
    also pay for fresh shared-memory pages and cold caches, either way: 341 against 345 us
    measured here, against ~230 and ~260 later); then, until each way has ``TRIALS``, the next
    goes the way that has fewer, and the lower median wins, for the life of the process."""

    WARMUP = 512
    TRIALS = 256

    def __init__(self) -> None:
        #: True: libjpeg writes the row; False: decode and copy; None: still measuring.
        self.choice: bool | None = None
        #: The medians it chose by, CPU µs per image (written into the row, copied).
        self.medians_us: tuple[float, float] | None = None
        self._cpu: dict[bool, list[float]] = {True: [], False: []}
        self._seen = 0

    def next(self) -> bool:
        """Whether the next image (if it is such a JPEG) is decoded straight into its row."""
        if self.choice is not None:
            return self.choice
        return len(self._cpu[True]) <= len(self._cpu[False])

    def record(self, into: bool, cpu_s: float) -> None:
        """One such image's decode thread CPU, decoded as ``into`` says (racing threads may
        add a sample or two past ``TRIALS``: the medians do not mind)."""
        if self.choice is not None:
            return
        self._seen += 1
        if self._seen <= self.WARMUP:
            return
        samples = self._cpu[into]
        if len(samples) < self.TRIALS:
            samples.append(cpu_s)
        if min(len(self._cpu[True]), len(self._cpu[False])) < self.TRIALS:
            return
        into_us = statistics.median(self._cpu[True]) * 1e6
        copy_us = statistics.median(self._cpu[False]) * 1e6
        self.medians_us = (round(into_us, 1), round(copy_us, 1))
        self.choice = into_us <= copy_us
        log.info(
            "JPEGs already the model's input: %s (median decode thread CPU %.0f us an image "
            "written by libjpeg into the batch row, %.0f us decoded and copied; %d each)",
            "libjpeg writes the batch row" if self.choice else "decoded, then copied",
            into_us, copy_us, self.TRIALS,
        )  # fmt: skip


class BatchDecoder:
    """One pool task per image (threads really run in parallel: the decoders release the GIL)."""

    def __init__(
        self,
        pool: Executor,
        tracer: Tracer,
        metrics: Metrics,
        on_decoded: OnDecoded | None = None,
    ) -> None:
        self._pool = pool
        watch_collections()  # the meter charges decodes, not the collector (pipeline/cputime.py)
        self._tracer = tracer
        self._metrics = metrics
        #: admission learns its decode rates from it, the trimmer how much memory was churned
        self._on_decoded = on_decoded
        self.rows = RowWrites()

    async def warm(self, options: DecodeOptions) -> None:
        """Decode ``_warm_files`` (a small image of each common format, then JPEGs of the
        sizes requests carry) once in each pool thread, before any request: a process's first
        JPEG decode costs more than the next (one-time set-up in the decoders and the resize;
        a compact JPEG's 1.3-1.9 ms here, 0.04-0.14 warmed: ``python -m bench decode-factors
        --first``); unwarmed, a fresh worker's first request paid that on its meter (8 photos
        priced 6 ms, 23 ms spent against a 20 ms budget: 429) and its latency."""
        threads = _threads(self._pool)
        meet = threading.Barrier(threads, timeout=5.0)  # one task in each thread: each warms
        loop = asyncio.get_running_loop()
        await asyncio.gather(
            *(loop.run_in_executor(self._pool, _warm, options, meet) for _ in range(threads))
        )

    async def decode(
        self,
        items: Sequence[ImageItem],
        options: DecodeOptions,
        *,
        skip_invalid: bool,
        indices: Sequence[int] | None = None,
        out: np.ndarray | None = None,
        meter: Meter | None = None,
        priced: Sequence[Work | None] | None = None,
    ) -> DecodedBatch:
        """All items, or raise the first bad one's error; with ``skip_invalid`` keep the good.
        ``indices``: each item's index in the request (default: its index here). ``out``: where to
        decode to (``[n, S, S, 3]``, e.g. a shared-memory region the backend sends from); ``pixels``
        is that very array when every item decoded; ``rows`` says which of its rows hold the images
        that did. ``meter``: the request's decode budget; once spent, the rest is not decoded and
        the request is stopped (Overspent, naming the first item not decoded). ``priced``: each
        item's price from admission under ``options.plan`` (or None), which holds its walked
        header when it read the whole file: the decode does not walk it again."""
        where = indices if indices is not None else range(len(items))
        size = options.size
        batch = np.empty((len(items), size, size, 3), dtype=np.uint8) if out is None else out
        with self._tracer.start_as_current_span("preprocess") as span:
            submitted = time.time_ns()
            results = await self._run(items, batch, options, meter, priced)
            good: list[tuple[int, _Timed]] = []
            errors: list[EmbeddingError] = []
            stopped: int | None = None
            for index, result in enumerate(results):
                if result is _NOT_STARTED:
                    stopped = where[index] if stopped is None else stopped
                elif isinstance(result, EmbeddingError):
                    result.index = where[index]
                    errors.append(result)
                elif isinstance(result, BaseException):
                    raise result
                elif isinstance(result, _Timed):
                    good.append((index, result))
            if stopped is not None:
                assert meter is not None
                if good:  # what it did spend is what admission learns the coding's rate from
                    self._observe(span, submitted, [t for _, t in good])
                raise _overspent(meter, stopped)
            if errors and self._on_decoded is not None:
                # a failed decode may have churned more than its bytes say (PNG text chunks,
                # a corrupt stream found late): hand the allocator's slack back
                self._on_decoded((), 0, -1)
            if errors and not skip_invalid:
                raise errors[0]
            if good:
                self._observe(span, submitted, [t for _, t in good])
            span.set_attribute("images.failed", len(errors))
        rows = [i for i, _ in good]
        pixels = batch if len(rows) == len(items) else batch[rows]
        indices = tuple(where[i] for i in rows)
        facts = tuple(t.decoded for _, t in good)
        return DecodedBatch(pixels, indices, tuple(rows), facts, tuple(errors))

    async def _run(
        self,
        items: Sequence[ImageItem],
        batch: np.ndarray,
        options: DecodeOptions,
        meter: Meter | None = None,
        priced: Sequence[Work | None] | None = None,
    ) -> list[object]:
        """The images in a few pool tasks of consecutive images each (``_chunks``), and one
        wake-up of the event loop per batch: the last task to finish reports for all (a future
        per image cost ~20% of a gateway core; a task per image, ~10% more)."""
        results: list[object] = [None] * len(items)
        stop = threading.Event()  # cancelled: a running task starts no more images

        def work(first: int, last: int) -> None:
            for index in range(first, last):
                try:
                    if stop.is_set() or (meter is not None and meter.over):
                        results[index] = _NOT_STARTED  # its thread is free for the next request
                        continue
                    work_ = priced[index] if priced is not None else None
                    results[index] = _decode_one(
                        items[index], batch[index], options, meter, work_, self.rows
                    )
                except EmbeddingError as exc:  # reported per item by the caller
                    results[index] = _detached(exc)
                except BaseException as exc:  # a bug or MemoryError: re-raised, traceback kept
                    results[index] = exc
            done.one_finished()

        chunks = _chunks(len(items), meter, _threads(self._pool))
        done = _Countdown(asyncio.get_running_loop(), len(chunks))
        if isinstance(self._pool, FairExecutor):
            # this request is one flow, each task its images' share of the request's price:
            # another client's photo queued meanwhile goes next, not behind every task of this one
            flow = Flow()
            each = meter.priced_s / len(items) if meter is not None and items else 1e-3
            tasks = [self._pool.submit_to(flow, each * (b - a), work, a, b) for a, b in chunks]
        else:
            tasks = [self._pool.submit(work, a, b) for a, b in chunks]
        try:
            await done.all_finished
        except asyncio.CancelledError:
            # decodes still queued never run; those running write into ``batch``, which may be
            # a shared-memory region lent for this request: it must not be lent again before
            # they are done (a few milliseconds: each running task stops after its image)
            stop.set()
            running = [task for task in tasks if not task.cancel()]
            if running:
                await asyncio.wait([asyncio.wrap_future(task) for task in running])
            raise
        return results

    def _observe(self, span: Span, submitted: int, timed: list[_Timed]) -> None:
        # one pass over the images (this runs on the event loop, for every batch)
        first_start = last_start = timed[0].start_ns
        last_end, cpu_ns, encoded, source, pixels = 0, 0, 0, 0, 0
        by_format: dict[str, list[int]] = {}
        for t in timed:
            decoded, start, end = t.decoded, t.start_ns, t.end_ns
            first_start, last_start = min(first_start, start), max(last_start, start)
            last_end = max(last_end, end)
            cpu_ns += end - start
            encoded += decoded.encoded_bytes
            source += decoded.width * decoded.height
            pixels += decoded.decoded_pixels
            by_format.setdefault(decoded.format, []).append(end - start)
        span.set_attributes(
            {
                "images": len(timed),
                "image.bytes": encoded,
                "image.source_pixels": source,
                "image.decoded_pixels": pixels,
                "image.formats": sorted(by_format),
            }
        )
        # Spans for what happened in worker threads, laid out from their own clocks.
        wait_max_ms = (last_start - submitted) / 1e6
        record_span(
            self._tracer, "pool.wait", submitted, first_start, {"pool.wait_max_ms": wait_max_ms}
        )
        if self._on_decoded is not None:
            self._on_decoded(_samples(timed), encoded, pixels)
        record_span(self._tracer, "decode", first_start, last_end, {"decode.cpu_ms": cpu_ns / 1e6})
        for fmt, durations in by_format.items():  # one label lookup per format, not per image
            self._metrics.images.labels(fmt).inc(len(durations))
            histogram = self._metrics.decode_seconds.labels(fmt)
            for ns in durations:
                histogram.observe(ns / 1e9)


#: Priced decode CPU-seconds a pool task takes at most (a task of one image may take more):
#: a few client uploads per task, one camera photo. Other requests' tasks wait at most this long
#: for a thread; fewer tasks per request cost the event loop and the threads fewer hand-offs.
CHUNK_S = 2e-3


def _chunks(count: int, meter: Meter | None, threads: int) -> list[tuple[int, int]]:
    """``range(count)`` cut into runs of consecutive images, one pool task each: at most
    ``CHUNK_S`` of priced work per run (unpriced: a millisecond an image), and at least one
    run per thread, so one request still spreads over every decode thread."""
    each = meter.priced_s / count if meter is not None and count else 1e-3
    size = max(1, min(int(CHUNK_S / each) if each > 0 else count, -(-count // max(1, threads))))
    return [(first, min(first + size, count)) for first in range(0, count, size)]


def _threads(pool: Executor) -> int:
    """The decode threads behind ``pool``."""
    if isinstance(pool, FairExecutor):
        return pool.threads
    return int(getattr(pool, "_max_workers", 1))


class _Countdown:
    """``count`` pool tasks; the event loop hears once, when the last one is done."""

    def __init__(self, loop: asyncio.AbstractEventLoop, count: int) -> None:
        self._loop = loop
        self._left = count
        self._lock = threading.Lock()
        self.all_finished: asyncio.Future[None] = loop.create_future()
        if count == 0:
            self.all_finished.set_result(None)

    def one_finished(self) -> None:
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            self._loop.call_soon_threadsafe(self._resolve)

    def _resolve(self) -> None:
        if not self.all_finished.done():  # cancelled meanwhile
            self.all_finished.set_result(None)


def _samples(timed: Sequence[_Timed]) -> list[DecodeSample]:
    by_coding: dict[str, list[float]] = {}
    for t in timed:
        sums = by_coding.setdefault(t.decoded.work.coding, [0.0, 0.0, 0])
        sums[0] += t.cpu_s
        sums[1] += t.decoded.work.seconds
        sums[2] += 1
    return [DecodeSample(c, cpu, priced, int(n)) for c, (cpu, priced, n) in by_coding.items()]


def _overspent(meter: Meter, index: int) -> Overspent:
    return Overspent(
        f"decoding stopped at item {index}: this request's images were priced at "
        f"{meter.priced_s:.3f} CPU-s and had spent {meter.spent_s:.3f}, over "
        f"{meter.budget_s:.3f} (the gateway has learned from it: a retry is priced higher)",
        index=index,
        priced_s=round(meter.priced_s, 4),
        spent_s=round(meter.spent_s, 4),
        budget_s=round(meter.budget_s, 4),
    )


def _detached(exc: EmbeddingError) -> EmbeddingError:
    """The error without its traceback and chained causes: their frames hold the image bytes
    and the decoder's buffers (and the pool task's frame, a reference cycle through the results
    list), which would otherwise stay alive until a full garbage collection. The reason, the
    item's index and the facts are all the answer needs."""
    exc.__traceback__ = None
    exc.__cause__ = exc.__context__ = None
    exc.__suppress_context__ = True
    return exc


def _warm(options: DecodeOptions, meet: threading.Barrier | None = None) -> None:
    if meet is not None:
        with contextlib.suppress(threading.BrokenBarrierError):
            meet.wait()  # so that no thread takes two of them
    out = np.empty((options.size, options.size, 3), np.uint8)
    for data in _warm_files():
        try:
            preprocess(data, out, options)
        except Exception as exc:  # a warm-up never stops a start: the request says it instead
            log.warning("decoder warm-up: %s: %s", type(exc).__name__, exc)


@functools.cache
def _warm_files() -> tuple[bytes, ...]:
    """What ``warm`` decodes: a small photo in the formats photo libraries send (those this
    Pillow can write: a build without WebP skips it), then JPEGs of the sizes most requests
    carry, which take the paths a 64x48 image does not (a DCT-scaled decode, a downscale): a
    compact 341x256 upload and a 1440x1080 preview (Immich's). Warmed with the small files
    only, a compact JPEG's first decode still cost 0.8-2.9 ms more than its next here; with
    these, 0.04-0.14 ms (bench/results/decode_factors/first_decode.md)."""
    small = photo(64, 48)
    images = [
        (small.convert("P") if form == "GIF" else small, form, kw) for form, kw in _WARM_FORMS
    ]
    for width, height in _WARM_SIZES:  # the scene made small and enlarged: cheap to make
        sized = photo(width // 8, height // 8).resize((width, height), Image.Resampling.BICUBIC)
        images.append((sized, "JPEG", {"quality": 85}))
    files = []
    for image, form, kwargs in images:
        encoded = io.BytesIO()
        try:
            image.save(encoded, form, **kwargs)
        except (OSError, KeyError, ValueError):
            continue
        files.append(encoded.getvalue())
    return tuple(files)


_WARM_SIZES = ((341, 256), (1440, 1080))


_WARM_FORMS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("JPEG", {}), ("JPEG", {"progressive": True}), ("PNG", {}), ("WEBP", {}), ("GIF", {}),
)  # fmt: skip


def _decode_one(
    item: ImageItem,
    out: np.ndarray,
    options: DecodeOptions,
    meter: Meter | None = None,
    priced: Work | None = None,
    rows: RowWrites | None = None,
) -> _Timed:
    into = rows.next() if rows is not None else True
    start, cpu = time.time_ns(), own_cpu_s()  # a collection run here is not the input's doing
    try:
        decoded = preprocess(item_bytes(item), out, options, priced, into_row=into)
    except (EmbeddingError, MemoryError):
        raise
    except Exception as exc:  # hostile bytes reach C decoders: any failure is the image's fault
        raise InvalidImage(f"cannot decode image: {type(exc).__name__}: {exc}") from exc
    finally:
        spent = own_cpu_s() - cpu  # failed decodes are paid for too
        if meter is not None:
            meter.spend(spent)
    if rows is not None and decoded.row is not None:
        rows.record(decoded.row == "into", spent)
    return _Timed(decoded, start, time.time_ns(), spent)
