"""Readiness canary: a fixed image (and a fixed text, when texts are served) whose embeddings
must match the ones recorded at export time.

A backend can be up, report the model READY and still be wrong: a corrupt TensorRT engine, FP16
overflow producing NaNs, a wedged GPU returning zeros, the wrong model file. Every
``GATEWAY_CANARY_INTERVAL_S`` the gateway embeds the canary and compares it with the reference that
`python -m clip_gateway.export` computed from the FP32 graph and the repository renderer put in the
model config (parameter ``canary_embedding``, model/contract.py); a failure turns /readyz to 503
until a check passes again. The text canary goes the whole text path: the gateway's tokenizer, then
the text model, so a tokenizer file that no longer matches the model fails it too.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import numpy as np

from clip_gateway.backend.protocol import InferenceBackend, ModelInfo
from clip_gateway.errors import EmbeddingError, ModalityUnavailable
from clip_gateway.model.contract import TEXT_CANARY, canary_pixels
from clip_gateway.pipeline.texts import BatchTokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CanaryResult:
    ok: bool
    detail: str
    checked_at: float  # time.monotonic()


class Canary:
    """Periodic canary inference; ``healthy()`` is what /readyz adds to the backend's readiness."""

    def __init__(
        self,
        backend: InferenceBackend,
        interval_s: float,
        min_cosine: float,
        timeout_s: float,
        tokenizer: BatchTokenizer | None = None,
    ) -> None:
        self.backend = backend
        self.tokenizer = tokenizer
        self.interval_s = interval_s
        self.min_cosine = min_cosine
        self.timeout_s = timeout_s
        self.last: CanaryResult | None = None
        #: without an export-time reference, the first result is the reference, per model
        self._first: dict[str, np.ndarray] = {}

    @property
    def enabled(self) -> bool:
        return self.interval_s > 0

    def healthy(self) -> bool:
        if not self.enabled:
            return True
        last = self.last
        # stale results count as failures: a wedged check must not keep the pod ready
        fresh = last is not None and time.monotonic() - last.checked_at < 3 * self.interval_s + 5
        return bool(fresh and last is not None and last.ok)

    async def run_once(self) -> CanaryResult:
        """Embed the canary now and judge it: the verdict, also kept as ``last`` (nothing
        raised; a failed inference is a failed verdict)."""
        try:
            info = await self.backend.model_info()
            deadline = time.monotonic() + self.timeout_s
            with self.backend.image_batch(1) as batch:
                batch.pixels[...] = canary_pixels(info.image_size)
                got = await self.backend.embed_images(batch, deadline=deadline)
            result = self._judge("image", got[0], info.canary)
            if result.ok and info.text is not None and self.tokenizer is not None:
                text = await self._text(info, deadline)
                result = CanaryResult(text.ok, f"{result.detail}; {text.detail}", text.checked_at)
        except EmbeddingError as exc:
            result = CanaryResult(False, f"canary inference failed: {exc.reason}", time.monotonic())
        if not result.ok:
            log.warning("canary failed: %s", result.detail)
        self.last = result
        return result

    async def _text(self, info: ModelInfo, deadline: float) -> CanaryResult:
        assert info.text is not None and self.tokenizer is not None
        try:
            tokenizer = self.tokenizer.for_model(info)
        except ModalityUnavailable as exc:  # images are still served; text requests say why
            return CanaryResult(True, f"no text canary: {exc.reason}", time.monotonic())
        tokens = tokenizer.tokenize([TEXT_CANARY])
        got = await self.backend.embed_texts(tokens, deadline=deadline)
        return self._judge("text", got[0], info.text.canary)

    def _judge(self, kind: str, got: np.ndarray, reference: np.ndarray | None) -> CanaryResult:
        now = time.monotonic()
        if not np.all(np.isfinite(got)) or not np.any(got):
            return CanaryResult(False, f"{kind} canary embedding is not finite or all zero", now)
        if reference is None:  # no export-time reference: at least insist on consistency
            reference = self._first.setdefault(kind, got)
        if reference.shape != got.shape:
            return CanaryResult(False, f"{kind} canary shape {got.shape} != {reference.shape}", now)
        cosine = float(np.dot(got, reference) / (np.linalg.norm(got) * np.linalg.norm(reference)))
        ok = cosine >= self.min_cosine
        return CanaryResult(ok, f"{kind} canary cosine {cosine:.5f} (min {self.min_cosine})", now)

    async def run(self) -> None:
        """``run_once`` now, then every interval, until cancelled (lifespan shutdown)."""
        while True:
            await self.run_once()
            await asyncio.sleep(self.interval_s)
