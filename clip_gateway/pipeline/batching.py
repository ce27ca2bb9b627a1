"""A request's images decoded in the thread pool into one uint8 batch, with spans and metrics."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np
from opentelemetry.trace import Span, Tracer

from clip_gateway.errors import EmbeddingError, InvalidImage
from clip_gateway.imaging.preprocess import Decoded, ImageOptions, preprocess
from clip_gateway.observability.metrics import Metrics
from clip_gateway.observability.tracing import record_span
from clip_gateway.pipeline.items import ImageItem, item_bytes


@dataclass(frozen=True)
class DecodedBatch:
    pixels: np.ndarray  # uint8 [n_ok, S, S, 3]
    indices: tuple[int, ...]  # the request index of each row
    rows: tuple[int, ...]  # the row of ``out`` (the batch decoded into) each one came from
    decoded: tuple[Decoded, ...]
    errors: tuple[EmbeddingError, ...]  # per-item failures (skip mode), each with its index


@dataclass(frozen=True)
class DecodeSample:
    """Decodes of one format in one batch: what admission learns its decode rate from."""

    format: str
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
        self._tracer = tracer
        self._metrics = metrics
        #: admission learns its decode rates from it, the trimmer how much memory was churned
        self._on_decoded = on_decoded

    async def decode(
        self,
        items: Sequence[ImageItem],
        options: ImageOptions,
        *,
        skip_invalid: bool,
        positions: Sequence[int] | None = None,
        out: np.ndarray | None = None,
    ) -> DecodedBatch:
        """All items, or raise the first bad one's error; with ``skip_invalid`` keep the good.
        ``positions``: each item's index in the request (default: its index here). ``out``: where
        to decode to (``[n, S, S, 3]``, e.g. a shared-memory region the backend sends from);
        ``pixels`` is that very array when every item decoded; ``rows`` says which of its rows
        hold the images that did."""
        where = positions if positions is not None else range(len(items))
        size = options.size
        batch = np.empty((len(items), size, size, 3), dtype=np.uint8) if out is None else out
        with self._tracer.start_as_current_span("preprocess") as span:
            submitted = time.time_ns()
            results = await self._run(items, batch, options)
            good: list[tuple[int, _Timed]] = []
            errors: list[EmbeddingError] = []
            for index, result in enumerate(results):
                if isinstance(result, EmbeddingError):
                    result.index = where[index]
                    errors.append(result)
                elif isinstance(result, BaseException):
                    raise result
                elif result is not None:
                    good.append((index, result))
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
        decoded = tuple(t.decoded for _, t in good)
        return DecodedBatch(pixels, indices, tuple(rows), decoded, tuple(errors))

    async def _run(
        self, items: Sequence[ImageItem], batch: np.ndarray, options: ImageOptions
    ) -> list[_Timed | BaseException | None]:
        """One pool task per image, but one wake-up of the event loop per batch: the last
        task to finish reports for all (a future per image cost ~20% of a gateway core)."""
        results: list[_Timed | BaseException | None] = [None] * len(items)
        done = _Countdown(asyncio.get_running_loop(), len(items))

        def work(index: int, item: ImageItem) -> None:
            try:
                results[index] = _decode_one(item, batch[index], options)
            except EmbeddingError as exc:  # reported per item by the caller
                results[index] = _detached(exc)
            except BaseException as exc:  # a bug or MemoryError: re-raised, traceback kept
                results[index] = exc
            finally:
                done.one_finished()

        tasks = [self._pool.submit(work, i, item) for i, item in enumerate(items)]
        try:
            await done.all_finished
        except asyncio.CancelledError:
            # decodes still queued never run; those running write into ``batch``, which may be
            # a shared-memory region lent for this request: it must not be lent again before
            # they are done (a few milliseconds)
            running = [task for task in tasks if not task.cancel()]
            if running:
                await asyncio.wait([asyncio.wrap_future(task) for task in running])
            raise
        return results

    def _observe(self, span: Span, submitted: int, timed: list[_Timed]) -> None:
        first_start = min(t.start_ns for t in timed)
        span.set_attributes(
            {
                "images": len(timed),
                "image.bytes": sum(t.decoded.encoded_bytes for t in timed),
                "image.source_pixels": sum(t.decoded.width * t.decoded.height for t in timed),
                "image.decoded_pixels": sum(t.decoded.decoded_pixels for t in timed),
                "image.formats": sorted({t.decoded.format for t in timed}),
            }
        )
        # Spans for what happened in worker threads, laid out from their own clocks.
        wait_max_ms = (max(t.start_ns for t in timed) - submitted) / 1e6
        record_span(
            self._tracer, "pool.wait", submitted, first_start, {"pool.wait_max_ms": wait_max_ms}
        )
        cpu_ms = sum(t.end_ns - t.start_ns for t in timed) / 1e6
        if self._on_decoded is not None:
            encoded = sum(t.decoded.encoded_bytes for t in timed)
            pixels = sum(t.decoded.decoded_pixels for t in timed)
            self._on_decoded(_samples(timed), encoded, pixels)
        last_end = max(t.end_ns for t in timed)
        record_span(self._tracer, "decode", first_start, last_end, {"decode.cpu_ms": cpu_ms})
        for t in timed:
            self._metrics.images.labels(t.decoded.format).inc()
            self._metrics.decode_seconds.labels(t.decoded.format).observe(
                (t.end_ns - t.start_ns) / 1e9
            )


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
    by_format: dict[str, list[float]] = {}
    for t in timed:
        sums = by_format.setdefault(t.decoded.work.format, [0.0, 0.0, 0])
        sums[0] += (t.end_ns - t.start_ns) / 1e9
        sums[1] += t.decoded.work.seconds
        sums[2] += 1
    return [DecodeSample(f, cpu, priced, int(n)) for f, (cpu, priced, n) in by_format.items()]


def _detached(exc: EmbeddingError) -> EmbeddingError:
    """The error without its traceback and chained causes: their frames hold the image bytes
    and the decoder's buffers (and the pool task's frame, a reference cycle through the results
    list), which would otherwise stay alive until a full garbage collection. The reason, the
    item's index and the facts are all the answer needs."""
    exc.__traceback__ = None
    exc.__cause__ = exc.__context__ = None
    exc.__suppress_context__ = True
    return exc


def _decode_one(item: ImageItem, out: np.ndarray, options: ImageOptions) -> _Timed:
    start = time.time_ns()
    try:
        decoded = preprocess(item_bytes(item), out, options)
    except (EmbeddingError, MemoryError):
        raise
    except Exception as exc:  # hostile bytes reach C decoders: any failure is the image's fault
        raise InvalidImage(f"cannot decode image: {type(exc).__name__}: {exc}") from exc
    return _Timed(decoded, start, time.time_ns())
