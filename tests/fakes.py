"""A deterministic in-process InferenceBackend for API tests (kept honest by tests/contract)."""

from __future__ import annotations

import asyncio

import numpy as np

from gateway.backend import ModelInfo
from gateway.errors import BackendUnavailable, GatewayError


class FakeBackend:
    """Embedding = a fixed random projection of the 8x8 mean-pooled image: cheap, content-bound."""

    def __init__(
        self, image_size: int = 224, embed_dim: int = 512, max_batch_size: int = 32
    ) -> None:
        self.info = ModelInfo("fake", image_size, embed_dim, max_batch_size)
        self.projection = np.random.default_rng(1234).standard_normal((8 * 8 * 3, embed_dim))
        self.calls: list[int] = []
        self.is_ready = True
        self.fail_with: GatewayError | None = None
        self.closed = False
        #: seconds each infer call takes (to hold requests in flight)
        self.delay = 0.0
        #: multiply outputs by this (NaN or 0 imitate a broken engine)
        self.scale = 1.0
        self.cancelled = 0

    async def model_info(self) -> ModelInfo:
        if not self.is_ready:
            raise BackendUnavailable("fake backend is not ready")
        return self.info

    async def infer(self, pixels: np.ndarray, *, deadline: float) -> np.ndarray:
        if self.fail_with is not None:
            raise self.fail_with
        if self.delay:
            try:
                await asyncio.sleep(self.delay)
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        n, size = pixels.shape[0], self.info.image_size
        if pixels.dtype != np.uint8 or pixels.shape[1:] != (size, size, 3):
            raise AssertionError(f"bad batch {pixels.dtype} {pixels.shape}")
        if n > self.info.max_batch_size:
            raise AssertionError(f"batch of {n} over max {self.info.max_batch_size}")
        self.calls.append(n)
        pooled = pixels.reshape(n, 8, size // 8, 8, size // 8, 3).mean(axis=(2, 4)).reshape(n, -1)
        return ((pooled / 255.0 - 0.5) @ self.projection * self.scale).astype(np.float32)

    async def ready(self) -> bool:
        return self.is_ready

    async def close(self) -> None:
        self.closed = True
