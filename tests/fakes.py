"""A deterministic in-process InferenceBackend for API tests.

It computes the same function as the control model (``tests/models/control.py``) that failure
tests load into a real Triton, and answers to the same knobs; the contract suite
(``tests/integration/test_backend_contract.py``) runs against both so the fake stays honest.
"""

from __future__ import annotations

import asyncio
import threading

import numpy as np

from clip_gateway.backend.protocol import ImageBatch, ModelInfo, TextModel
from clip_gateway.errors import BackendFailed, BackendTimeout, BackendUnavailable

CONTEXT_LENGTH = 77


def projection(embed_dim: int) -> np.ndarray:
    rows = np.arange(1, 8 * 8 * 3 + 1, dtype=np.float64)[:, None]
    cols = np.arange(1, embed_dim + 1, dtype=np.float64)[None, :]
    return np.sin(rows * cols * 0.618034 + rows * 0.1)


def embed(pixels: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """8x8 mean pool then a fixed projection: cheap, and bound to the image's content."""
    n, size = pixels.shape[0], pixels.shape[1]
    pooled = pixels.reshape(n, 8, size // 8, 8, size // 8, 3).mean(axis=(2, 4)).reshape(n, -1)
    return ((pooled / 255.0 - 0.5) @ weights).astype(np.float32)


def embed_tokens(tokens: np.ndarray, embed_dim: int) -> np.ndarray:
    """Each token by its id and place, averaged: cheap, and bound to the text's tokens."""
    cols = np.arange(1, embed_dim + 1, dtype=np.float64)[None, None, :]
    places = np.arange(tokens.shape[1], dtype=np.float64)[None, :, None]
    waves = np.sin(tokens.astype(np.float64)[:, :, None] * cols * 1e-3 + places * 0.37)
    return waves.mean(axis=1).astype(np.float32)  # type: ignore[no-any-return]


class FakeBackend:
    """Knobs (as the control model's): ``mode`` ok | error | nan | negate | unavailable,
    ``delay_s``, and ``hold()`` / ``release()``; ``arrivals`` counts calls that reached it
    (``calls`` their sizes, ``text_calls`` the text model's); ``lent``: image batches not given
    back. With a ``tokenizer_file`` it
    serves texts too, by ``embed_tokens``."""

    def __init__(
        self,
        image_size: int = 224,
        embed_dim: int = 512,
        max_batch_size: int = 32,
        tokenizer_file: str | None = None,
        instances: int = 1,
    ) -> None:
        text = None
        if tokenizer_file is not None:
            text = TextModel("fake_text", CONTEXT_LENGTH, max_batch_size, str(tokenizer_file),
                             instances=instances)  # fmt: skip
        self.info = ModelInfo(
            "fake", image_size, embed_dim, max_batch_size, text=text,
            text_unavailable=None if text else "the fake backend has no text model",
            instances=instances,
        )  # fmt: skip
        self.weights = projection(embed_dim)
        self.text_calls: list[int] = []
        self.mode = "ok"
        self.delay_s = 0.0
        self._released = threading.Event()
        self._released.set()
        self.calls: list[int] = []
        self.arrivals = 0
        self.cancelled = 0
        #: calls of any kind (model_info, infer, ready): what a probe must not do
        self.touched = 0
        self.closed = False
        #: image batches lent and not given back, and lent in all
        self.lent = 0
        self.batches = 0
        self._known = False

    def hold(self) -> None:
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    async def model_info(self) -> ModelInfo:
        self.touched += 1
        if self.mode == "unavailable":
            raise BackendUnavailable("fake backend is down")
        self._known = True
        return self.info

    def image_batch(self, count: int) -> ImageBatch:
        if not self._known:  # as Triton's: the size is known once model_info has answered
            raise BackendUnavailable("the model is not known yet: ask model_info first")
        size = self.info.image_size
        self.lent += 1
        self.batches += 1
        return ImageBatch(np.empty((count, size, size, 3), dtype=np.uint8), on_close=self._back)

    def _back(self) -> None:
        self.lent -= 1

    async def embed_images(self, batch: ImageBatch, *, deadline: float) -> np.ndarray:
        self.touched += 1
        if self.mode == "unavailable":
            raise BackendUnavailable("fake backend is down")
        pixels = batch.pixels
        n, size = pixels.shape[0], self.info.image_size
        if pixels.dtype != np.uint8 or pixels.shape[1:] != (size, size, 3):
            raise AssertionError(f"bad batch {pixels.dtype} {pixels.shape}")
        if n > self.info.max_batch_size:
            raise AssertionError(f"batch of {n} over max {self.info.max_batch_size}")
        self.calls.append(n)
        await self._behave(deadline)
        rows = embed(pixels, self.weights)
        return self._answer(rows)

    async def embed_texts(self, tokens: np.ndarray, *, deadline: float) -> np.ndarray:
        self.touched += 1
        if self.mode == "unavailable":
            raise BackendUnavailable("fake backend is down")
        text = self.info.text
        if text is None:
            raise AssertionError("text inference on a backend without a text model")
        if tokens.dtype != np.int32 or tokens.shape[1:] != (text.context_length,):
            raise AssertionError(f"bad tokens {tokens.dtype} {tokens.shape}")
        if len(tokens) > text.max_batch_size:
            raise AssertionError(f"batch of {len(tokens)} over max {text.max_batch_size}")
        self.text_calls.append(len(tokens))
        await self._behave(deadline)
        return self._answer(embed_tokens(tokens, self.info.embed_dim))

    async def _behave(self, deadline: float) -> None:
        self.arrivals += 1
        try:
            # time.monotonic() is the event loop's clock, as the protocol's deadline is
            async with asyncio.timeout_at(deadline):
                # a threading.Event: tests release it from their own thread, not this loop's
                while not self._released.is_set():  # noqa: ASYNC110
                    await asyncio.sleep(0.005)
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
        except TimeoutError as exc:
            raise BackendTimeout("fake backend: deadline passed") from exc
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if self.mode == "error":
            raise BackendFailed("fake backend: failing on purpose")

    def _answer(self, rows: np.ndarray) -> np.ndarray:
        if self.mode == "nan":
            rows[:] = np.nan
        elif self.mode == "negate":
            rows = -rows
        return rows

    async def ready(self) -> bool:
        self.touched += 1
        return self.mode != "unavailable"

    async def close(self) -> None:
        self.closed = True
