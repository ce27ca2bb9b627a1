"""The seam between the pipeline and whatever runs the model: a batch it lends in, numpy out."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol, Self

import numpy as np

from clip_gateway.backend.shm import Region
from clip_gateway.imaging.preprocess import Interpolation, ResizeMode


@dataclass(frozen=True)
class ModelPreprocessing:
    """The image preprocessing the model was trained with (the export's ``preprocess``;
    docs/EXPORT.md): what the gateway does before the graph, and what /v1/models shows.
    Mean and std are applied inside the graph; they are here to be reported."""

    size: int
    resize_mode: ResizeMode = "shortest"
    interpolation: Interpolation = "bicubic"
    fill_color: tuple[int, int, int] = (0, 0, 0)
    mean: tuple[float, float, float] | None = None
    std: tuple[float, float, float] | None = None
    #: The pretrained tag whose configuration this is (random weights use the default tag's).
    from_tag: str | None = None


@dataclass(frozen=True)
class TextModel:
    """The text tower, when the gateway can tokenise for it."""

    name: str
    context_length: int
    max_batch_size: int
    #: The tokenizer file (a ``tokenizers`` file the exporter wrote), readable by the gateway.
    tokenizer_file: str
    #: Its kind: ``clip_bpe`` (open_clip's SimpleTokenizer) or ``hf`` (open_clip's HFTokenizer).
    tokenizer_kind: str = "clip_bpe"
    #: open_clip's cleaning before tokenising (``lower``, ``whitespace``, ``canonicalize``).
    clean: str = "lower"
    #: With open_clip's ``strip_sep_token``: the separator id replaced by 0 after tokenising.
    strip_sep_id: int | None = None
    #: How the text graph pools its tokens (``argmax``, ``last``, ...), as the export recorded it.
    pooling: str | None = None
    #: Export-time embedding of ``contract.TEXT_CANARY``, when the config has one.
    canary: np.ndarray | None = field(default=None, compare=False)
    #: Model instances that run calls side by side (the config's instance groups).
    instances: int = 1


@dataclass(frozen=True)
class ModelInfo:
    """What the gateway needs to know about the served model, read from the backend at start."""

    name: str
    image_size: int
    embed_dim: int
    max_batch_size: int
    #: Export-time embedding of the canary image (pipeline/canary.py), when the config has one.
    canary: np.ndarray | None = field(default=None, compare=False)
    #: None: open_clip's classic transform at ``image_size`` (exports from before it was recorded).
    preprocessing: ModelPreprocessing | None = None
    text: TextModel | None = None
    #: Why texts cannot be embedded, when ``text`` is None.
    text_unavailable: str | None = None
    #: Per tower (``image``, ``text``), its precision and the INT8 quality gate's figures, when
    #: the profile is ``cpu-int8`` (the configs' quantization parameter; docs/PROFILES.md "The
    #: cpu-int8 profile"), or its runtime, BF16 precision and gate figures with ``cpu-bf16``.
    #: None: the export's own FP32/FP16 graphs, nothing quantized.
    quantization: dict[str, Any] | None = field(default=None, compare=False)
    #: Model instances that run calls side by side (the config's instance groups): a request
    #: larger than one image is split so every instance gets a share (pipeline/service.py).
    instances: int = 1

    @property
    def image_preprocessing(self) -> ModelPreprocessing:
        return self.preprocessing or ModelPreprocessing(self.image_size)

    @property
    def modalities(self) -> tuple[str, ...]:
        return ("image", "text") if self.text is not None else ("image",)


class ImageBatch:
    """``n`` images' pixels, uint8 ``[n, S, S, 3]``, lent by the backend (``image_batch``) to be
    filled and then run (``embed_images``). With the Triton backend on Triton's host the array
    lies in a shared-memory region, so what the decoders write is what Triton reads, with no
    copy; otherwise it is a plain array. A context manager: leaving it gives the region back
    (on error and cancellation too); the rows must not be written after that."""

    def __init__(
        self,
        pixels: np.ndarray,
        *,
        region: Region | None = None,
        offset: int = 0,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self.pixels = pixels
        #: The shared-memory region ``pixels`` lies in, and its byte offset there (None: a
        #: plain array).
        self.region = region
        self.offset = offset
        self._on_close = on_close

    def __len__(self) -> int:
        return len(self.pixels)

    def rows(self, start: int, stop: int) -> ImageBatch:
        """Rows ``start:stop`` as a batch of their own, in the same memory (one model call's
        share when a request is split); the whole batch still owns the memory."""
        row_bytes = int(np.prod(self.pixels.shape[1:], dtype=np.int64)) * self.pixels.itemsize
        return ImageBatch(
            self.pixels[start:stop], region=self.region, offset=self.offset + start * row_bytes
        )

    def keep(self, rows: Sequence[int]) -> ImageBatch:
        """Only ``rows`` (ascending), moved to the front in place: the images that decoded,
        when some did not (skip_invalid)."""
        if len(rows) == len(self.pixels):
            return self
        if rows:
            self.pixels[: len(rows)] = self.pixels[list(rows)]
        return self.rows(0, len(rows))

    def close(self) -> None:
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class InferenceBackend(Protocol):
    """Runs the two encoders over batches. Implementations raise only ``clip_gateway.errors``
    exceptions.

    An image batch is lent by ``image_batch`` (``n <= max_batch_size`` rows per
    ``embed_images`` call); ``tokens`` is int32 ``[n, context_length]`` with
    ``n <= text.max_batch_size``. Results are float32 ``[n, D]``, row ``i`` for item ``i``, not
    normalised. ``deadline`` is a ``time.monotonic()`` instant: the call, queueing in the backend
    included, must be over by then.
    """

    async def model_info(self) -> ModelInfo:
        """Describe the model; raises BackendUnavailable until the backend can answer."""
        ...

    def image_batch(self, count: int) -> ImageBatch:
        """A writable batch of ``count`` images at the model's size (``model_info`` has
        answered), in the memory the backend sends from when it has such memory free."""
        ...

    async def embed_images(self, batch: ImageBatch, *, deadline: float) -> np.ndarray:
        """Embed one batch of images (of ``image_batch``, or rows of one) before ``deadline``."""
        ...

    async def embed_texts(self, tokens: np.ndarray, *, deadline: float) -> np.ndarray:
        """Embed one batch of token rows before ``deadline`` (only when ``text`` is served)."""
        ...

    async def ready(self) -> bool:
        """True when every model served can take requests right now."""
        ...

    async def close(self) -> None: ...
