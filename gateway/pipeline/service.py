"""Embedding service: items in, embeddings out. Knows nothing of HTTP.

Admission (pipeline/admission.py) is decided by the caller while the request is read; the
service feeds it the decode and backend timings it learns the costs from. Decoding runs in the
thread pool (pipeline/batching.py); batches larger than the model's max are split and sent
concurrently, and Triton's dynamic batcher merges calls from concurrent requests. The whole
request runs under one deadline, which also bounds each gRPC call.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np
from opentelemetry.trace import NoOpTracer, Tracer

from gateway.backend.protocol import InferenceBackend, ModelInfo
from gateway.errors import (
    BackendFailed,
    BackendTimeout,
    BackendUnavailable,
    DeadlineExceeded,
    EmbeddingError,
)
from gateway.imaging.preprocess import Decoded, ImageOptions
from gateway.observability.metrics import Metrics
from gateway.pipeline.admission import Admission
from gateway.pipeline.batching import BatchDecoder
from gateway.pipeline.items import ImageItem
from gateway.runtime import memory
from gateway.runtime.settings import ServerSettings


@dataclass(frozen=True)
class Embeddings:
    vectors: np.ndarray  # float32 [n_ok, D]
    indices: tuple[int, ...]  # request index of each row
    errors: tuple[EmbeddingError, ...]  # skipped items (skip_invalid), each with its index
    model: ModelInfo
    decoded: tuple[Decoded, ...]
    decode_seconds: float
    infer_seconds: float


class EmbeddingService:
    def __init__(
        self,
        backend: InferenceBackend,
        pool: Executor,
        settings: ServerSettings,
        *,
        decode_threads: int = 1,
        tracer: Tracer | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self._backend = backend
        self._settings = settings
        self._metrics = metrics or Metrics()
        self.admission = Admission(
            settings.horizon_s,
            decode_threads,
            self._metrics,
            infer_s_per_image=settings.admission_infer_s_per_image,
            max_body_bytes_in_flight=settings.max_body_mib_in_flight << 20,
        )
        self._trimmer = memory.Trimmer(pool.submit)
        self._decoder = BatchDecoder(pool, tracer or NoOpTracer(), self._metrics, self._decoded)

    def _decoded(self, cpu_seconds: float, encoded: int, items: int, pixels: int) -> None:
        self.admission.observe_decode(cpu_seconds, encoded, items)
        # bodies, decoded images (RGBX) and their resize: what may stay in the allocator
        self._trimmer.worked(encoded * 2 + pixels * 8)

    async def model_info(self) -> ModelInfo:
        return await self._backend.model_info()

    async def ready(self) -> bool:
        return await self._backend.ready()

    async def embed(
        self, items: Sequence[ImageItem], *, normalize: bool = True, skip_invalid: bool = False
    ) -> Embeddings:
        """Embed admitted items (the caller holds their ``Reservation``) within the deadline."""
        timeout = self._settings.request_timeout_s
        try:
            async with asyncio.timeout(timeout):
                return await self._embed(items, normalize, skip_invalid)
        except TimeoutError as exc:
            raise DeadlineExceeded(f"request took longer than {timeout:g} s") from exc

    async def _embed(
        self, items: Sequence[ImageItem], normalize: bool, skip_invalid: bool
    ) -> Embeddings:
        deadline = time.monotonic() + self._settings.request_timeout_s
        model = await self._backend.model_info()
        options = ImageOptions(
            size=model.image_size,
            max_pixels=self._settings.max_image_pixels,
            max_bytes=self._settings.max_image_bytes,
            max_decode_bytes=self._settings.max_decode_mib << 20,
            progressive_dc_only=self._settings.progressive_dc_only,
        )
        started = time.perf_counter()
        batch = await self._decoder.decode(items, options, skip_invalid=skip_invalid)
        decoded_at = time.perf_counter()
        if len(batch.pixels):
            vectors = await self.infer(batch.pixels, model, deadline)
        else:
            vectors = np.empty((0, model.embed_dim), dtype=np.float32)
        if normalize:
            norms = np.linalg.norm(vectors, axis=1, keepdims=True)
            vectors = vectors / np.maximum(norms, np.finfo(np.float32).tiny)
        return Embeddings(
            vectors=vectors,
            indices=batch.indices,
            errors=batch.errors,
            model=model,
            decoded=batch.decoded,
            decode_seconds=decoded_at - started,
            infer_seconds=time.perf_counter() - decoded_at,
        )

    async def infer(self, pixels: np.ndarray, model: ModelInfo, deadline: float) -> np.ndarray:
        limit = min(self._settings.max_batch_size or model.max_batch_size, model.max_batch_size)
        chunks = [pixels[i : i + limit] for i in range(0, len(pixels), limit)]
        results = await asyncio.gather(*(self._infer_chunk(chunk, deadline) for chunk in chunks))
        return results[0] if len(results) == 1 else np.concatenate(results)

    async def _infer_chunk(self, chunk: np.ndarray, deadline: float) -> np.ndarray:
        started, outcome = time.perf_counter(), "ok"
        self.admission.infer_started()
        try:
            rows = await self._backend.infer(chunk, deadline=deadline)
            self.admission.infer_finished(len(chunk))
            return rows
        except EmbeddingError as exc:
            outcome = _OUTCOMES.get(type(exc), "error")
            self.admission.infer_finished(0)
            raise
        except asyncio.CancelledError:
            outcome = "cancelled"
            self.admission.infer_finished(0)
            raise
        finally:
            self._metrics.triton_seconds.labels(outcome).observe(time.perf_counter() - started)
            self._metrics.triton_batch.observe(len(chunk))


#: gateway_triton_request_duration_seconds{outcome}: how a backend call ended.
_OUTCOMES = {
    BackendUnavailable: "backend-unavailable",
    BackendTimeout: "backend-timeout",
    BackendFailed: "backend-error",
}
