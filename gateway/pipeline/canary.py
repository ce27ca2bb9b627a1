"""Readiness canary: a fixed image whose embedding must match the one recorded at export time.

A backend can be up, report the model READY and still be wrong: a corrupt TensorRT engine, FP16
overflow producing NaNs, a wedged GPU returning zeros, the wrong model file. Every
``GATEWAY_CANARY_INTERVAL_S`` the gateway embeds the canary and compares it with the reference
that `python -m export` computed from the FP32 graph and the repository renderer put in the model
config (parameter ``canary_embedding``, backend/contract.py); a failure turns /readyz to 503 until
a check passes again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import numpy as np

from gateway.backend.contract import canary_pixels
from gateway.backend.protocol import InferenceBackend
from gateway.errors import EmbeddingError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CanaryResult:
    ok: bool
    detail: str
    checked_at: float  # time.monotonic()


class Canary:
    """Periodic canary inference; ``healthy()`` is what /readyz adds to the backend's readiness."""

    def __init__(
        self, backend: InferenceBackend, interval_s: float, min_cosine: float, timeout_s: float
    ) -> None:
        self.backend = backend
        self.interval_s = interval_s
        self.min_cosine = min_cosine
        self.timeout_s = timeout_s
        self.last: CanaryResult | None = None
        self._first: np.ndarray | None = None

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

    async def check(self) -> CanaryResult:
        try:
            info = await self.backend.model_info()
            got = await self.backend.infer(
                canary_pixels(info.image_size), deadline=time.monotonic() + self.timeout_s
            )
            result = self._judge(got[0], info.canary)
        except EmbeddingError as exc:
            result = CanaryResult(False, f"canary inference failed: {exc.reason}", time.monotonic())
        if not result.ok:
            log.warning("canary failed: %s", result.detail)
        self.last = result
        return result

    def _judge(self, got: np.ndarray, reference: np.ndarray | None) -> CanaryResult:
        now = time.monotonic()
        if not np.all(np.isfinite(got)) or not np.any(got):
            return CanaryResult(False, "canary embedding is not finite or all zero", now)
        if reference is None:  # no export-time reference: at least insist on consistency
            reference = self._first if self._first is not None else got
            self._first = reference
        if reference.shape != got.shape:
            return CanaryResult(False, f"canary shape {got.shape} != {reference.shape}", now)
        cosine = float(np.dot(got, reference) / (np.linalg.norm(got) * np.linalg.norm(reference)))
        ok = cosine >= self.min_cosine
        return CanaryResult(ok, f"canary cosine {cosine:.5f} (min {self.min_cosine})", now)

    async def run(self) -> None:
        """Check now, then every interval, until cancelled (lifespan shutdown)."""
        while True:
            await self.check()
            await asyncio.sleep(self.interval_s)
