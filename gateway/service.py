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

import numpy as np

from gateway.backend import InferenceBackend, ModelInfo
from gateway.errors import GatewayError, InvalidImage
from gateway.images import Decoded, ImageOptions, preprocess
from gateway.settings import GatewaySettings

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


class EmbeddingService:
    def __init__(
        self, backend: InferenceBackend, pool: Executor, settings: GatewaySettings
    ) -> None:
        self._backend = backend
        self._pool = pool
        self._settings = settings

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
        loop = asyncio.get_running_loop()
        tasks = [
            loop.run_in_executor(self._pool, _preprocess_one, item, batch[i], options)
            for i, item in enumerate(items)
        ]
        results = await asyncio.gather(*tasks, return_exceptions=True)
        decoded: list[Decoded] = []
        for index, result in enumerate(results):
            if isinstance(result, GatewayError):
                result.index = index
                raise result
            if isinstance(result, BaseException):
                raise result
            decoded.append(result)
        return batch, tuple(decoded)

    async def infer(self, pixels: np.ndarray, model: ModelInfo, deadline: float) -> np.ndarray:
        limit = min(self._settings.max_batch_size or model.max_batch_size, model.max_batch_size)
        chunks = [pixels[i : i + limit] for i in range(0, len(pixels), limit)]
        results = await asyncio.gather(
            *(self._backend.infer(chunk, deadline=deadline) for chunk in chunks)
        )
        return results[0] if len(results) == 1 else np.concatenate(results)


def _preprocess_one(item: ImageItem, out: np.ndarray, options: ImageOptions) -> Decoded:
    try:
        return preprocess(item_bytes(item), out, options)
    except (GatewayError, MemoryError):
        raise
    except Exception as exc:  # hostile bytes reach C decoders: any failure is the image's fault
        raise InvalidImage(f"cannot decode image: {type(exc).__name__}: {exc}") from exc
