"""The seam between the service and whatever runs the model: numpy in, numpy out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class ModelInfo:
    """What the gateway needs to know about the served model, read from the backend at start."""

    name: str
    image_size: int
    embed_dim: int
    max_batch_size: int
    #: Export-time embedding of the canary image (pipeline/canary.py), when the config has one.
    canary: np.ndarray | None = field(default=None, compare=False)


class InferenceBackend(Protocol):
    """Runs the image encoder. Implementations raise only ``gateway.errors`` exceptions.

    ``pixels`` is uint8 ``[n, S, S, 3]`` with ``n <= max_batch_size``; the result is float32
    ``[n, D]``, row ``i`` for image ``i``, not normalised. ``deadline`` is a ``time.monotonic()``
    instant: the call, queueing in the backend included, must be over by then.
    """

    async def model_info(self) -> ModelInfo:
        """Describe the model; raises BackendUnavailable until the backend can answer."""
        ...

    async def infer(self, pixels: np.ndarray, *, deadline: float) -> np.ndarray:
        """Embed one batch before ``deadline``."""
        ...

    async def ready(self) -> bool:
        """True when the model can serve requests right now."""
        ...

    async def close(self) -> None: ...
