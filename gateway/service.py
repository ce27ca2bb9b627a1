"""Embedding service: items in, embeddings out. Knows nothing of HTTP.

CPU work (base64, decode, resize) runs in a bounded thread pool: libjpeg-turbo, Pillow's resize
and base64 decoding release the GIL, so N threads really use N cores, while the event loop stays
free for I/O. Batches larger than the model's max are split and sent concurrently; Triton's
dynamic batcher merges calls from concurrent requests.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import time
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import numpy as np
from opentelemetry.trace import NoOpTracer, Tracer

from gateway.backend import InferenceBackend, ModelInfo
from gateway.errors import GatewayError, InvalidImage
from gateway.images import Decoded, ImageOptions, preprocess
from gateway.metrics import Metrics
from gateway.settings import GatewaySettings
from gateway.telemetry import record_span

#: An image as raw bytes (multipart) or as base64 / a ``data:`` URI (JSON).
ImageItem = bytes | str


@dataclass(frozen=True)
class Embeddings:
    vectors: np.ndarray  # float32 [n, D]
    model: ModelInfo
    decoded: tuple[Decoded, ...]
    decode_seconds: float
    infer_seconds: float


def item_bytes(item: ImageItem) -> bytes:
    """Raw bytes of an item; base64 and ``data:`` URIs are decoded strictly."""
    if isinstance(item, bytes):
        return item
    text = item
    if text.startswith("data:"):
        header, sep, text = text.partition(",")
        if not sep or not header.endswith(";base64"):
            raise InvalidImage("data: URI must be base64-encoded (data:image/jpeg;base64,...)")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidImage(f"invalid base64: {exc}") from exc


@dataclass(frozen=True)
class _Timed:
    decoded: Decoded
    start_ns: int
    end_ns: int


class EmbeddingService:
    def __init__(
        self,
        backend: InferenceBackend,
        pool: Executor,
        settings: GatewaySettings,
        *,
        tracer: Tracer | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self._backend = backend
        self._pool = pool
        self._settings = settings
        self._tracer = tracer or NoOpTracer()
        self._metrics = metrics or Metrics()

    async def model_info(self) -> ModelInfo:
        return await self._backend.model_info()

    async def ready(self) -> bool:
        return await self._backend.ready()

    async def embed(self, items: Sequence[ImageItem], *, normalize: bool = True) -> Embeddings:
        deadline = time.monotonic() + self._settings.request_timeout_s
        model = await self._backend.model_info()
        started = time.perf_counter()
        pixels, decoded = await self.preprocess(items, model.image_size)
        decoded_at = time.perf_counter()
        vectors = await self.infer(pixels, model, deadline)
        if normalize:
            norms = np.linalg.norm(vectors, axis=1, keepdims=True)
            vectors = vectors / np.maximum(norms, np.finfo(np.float32).tiny)
        return Embeddings(
            vectors=vectors,
            model=model,
            decoded=decoded,
            decode_seconds=decoded_at - started,
            infer_seconds=time.perf_counter() - decoded_at,
        )

    async def preprocess(
        self, items: Sequence[ImageItem], size: int
    ) -> tuple[np.ndarray, tuple[Decoded, ...]]:
        """Decode every item into one preallocated uint8 batch, one pool task per image."""
        options = ImageOptions(
            size=size,
            max_pixels=self._settings.max_image_pixels,
            max_bytes=self._settings.max_image_bytes,
            progressive_dc_only=self._settings.progressive_dc_only,
        )
        batch = np.empty((len(items), size, size, 3), dtype=np.uint8)
        with self._tracer.start_as_current_span("preprocess") as span:
            loop = asyncio.get_running_loop()
            submitted = time.time_ns()
            tasks = [
                loop.run_in_executor(self._pool, _preprocess_one, item, batch[i], options)
                for i, item in enumerate(items)
            ]
            results = await asyncio.gather(*tasks, return_exceptions=True)
            timed: list[_Timed] = []
            for index, result in enumerate(results):
                if isinstance(result, GatewayError):
                    result.index = index
                    raise result
                if isinstance(result, BaseException):
                    raise result
                timed.append(result)
            self._observe_decoding(span, submitted, timed)
        return batch, tuple(t.decoded for t in timed)

    def _observe_decoding(self, span: Any, submitted: int, timed: list[_Timed]) -> None:
        first_start = min(t.start_ns for t in timed)
        last_end = max(t.end_ns for t in timed)
        cpu_ns = sum(t.end_ns - t.start_ns for t in timed)
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
        wait_max = max(t.start_ns for t in timed) - submitted
        record_span(
            self._tracer, "pool.wait", submitted, first_start, {"pool.wait_max_ms": wait_max / 1e6}
        )
        record_span(self._tracer, "decode", first_start, last_end, {"decode.cpu_ms": cpu_ns / 1e6})
        for t in timed:
            self._metrics.images.labels(t.decoded.format).inc()
            self._metrics.decode_seconds.labels(t.decoded.format).observe(
                (t.end_ns - t.start_ns) / 1e9
            )

    async def infer(self, pixels: np.ndarray, model: ModelInfo, deadline: float) -> np.ndarray:
        limit = min(self._settings.max_batch_size or model.max_batch_size, model.max_batch_size)
        chunks = [pixels[i : i + limit] for i in range(0, len(pixels), limit)]
        results = await asyncio.gather(*(self._infer_chunk(chunk, deadline) for chunk in chunks))
        return results[0] if len(results) == 1 else np.concatenate(results)

    async def _infer_chunk(self, chunk: np.ndarray, deadline: float) -> np.ndarray:
        started, outcome = time.perf_counter(), "ok"
        try:
            return await self._backend.infer(chunk, deadline=deadline)
        except GatewayError as exc:
            outcome = exc.slug
            raise
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            self._metrics.triton_seconds.labels(outcome).observe(time.perf_counter() - started)
            self._metrics.triton_batch.observe(len(chunk))


def _preprocess_one(item: ImageItem, out: np.ndarray, options: ImageOptions) -> _Timed:
    start = time.time_ns()
    try:
        decoded = preprocess(item_bytes(item), out, options)
    except (GatewayError, MemoryError):
        raise
    except Exception as exc:  # hostile bytes reach C decoders: any failure is the image's fault
        raise InvalidImage(f"cannot decode image: {type(exc).__name__}: {exc}") from exc
    return _Timed(decoded, start, time.time_ns())
