"""A request's texts to token rows: checked one by one, then tokenised in the thread pool with
the model's own tokenizer (clip_gateway/text), loaded once per process from the file the model
repository names (after the worker's fork: ``tokenizers`` keeps threads of its own)."""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np

from clip_gateway.backend.protocol import ModelInfo
from clip_gateway.errors import EmbeddingError, InvalidText, LimitExceeded, ModalityUnavailable
from clip_gateway.observability.metrics import Metrics
from clip_gateway.pipeline.items import TextItem
from clip_gateway.text import Tokenizer, Variant, load_tokenizer

# One request's texts are tokenised by one pool thread; the pool spreads requests over the cores,
# so the tokenizer's own thread pool would only oversubscribe them.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@dataclass(frozen=True)
class TokenBatch:
    tokens: np.ndarray  # int32 [n_ok, context_length]
    indices: tuple[int, ...]  # the request index of each row
    #: Tokens the model reads of each row (start and end included, padding not).
    counts: tuple[int, ...]

    @property
    def token_count(self) -> int:
        return sum(self.counts)


class BatchTokenizer:
    """A request's texts to one batch of token rows, as ``BatchDecoder`` makes its images one
    batch of pixels: each text checked, then all tokenised in one pool task."""

    def __init__(self, pool: Executor, max_chars: int, metrics: Metrics) -> None:
        self._pool = pool
        self.max_chars = max_chars
        self._metrics = metrics
        #: per tokenizer file and framing: the loaded tokenizer, or why it could not be loaded
        self._tokenizers: dict[tuple[str, str, int, str, int | None], Tokenizer | str] = {}

    def for_model(self, model: ModelInfo) -> Tokenizer:
        """The model's tokenizer, or ModalityUnavailable saying why there is none."""
        if model.text is None:
            raise ModalityUnavailable(
                f"this model embeds images only: {model.text_unavailable or 'no text model'}"
            )
        text = model.text
        key = (
            text.tokenizer_kind,
            text.tokenizer_file,
            text.context_length,
            text.clean,
            text.strip_sep_id,
        )
        loaded = self._tokenizers.get(key)
        if loaded is None:
            try:
                loaded = load_tokenizer(
                    text.tokenizer_kind,
                    text.tokenizer_file,
                    text.context_length,
                    clean=text.clean,
                    strip_sep_id=text.strip_sep_id,
                )
            except Exception as exc:  # a missing or foreign file: text cannot be served
                loaded = (
                    f"the {text.tokenizer_kind} tokenizer file {text.tokenizer_file} cannot be "
                    f"loaded by the gateway: {exc}"
                )
            self._tokenizers[key] = loaded
        if isinstance(loaded, str):
            raise ModalityUnavailable(loaded)
        return loaded

    def problem(self, text: str, index: int) -> EmbeddingError | None:
        """Why ``text`` cannot be embedded, before any work is spent on it."""
        if len(text) > self.max_chars:
            return LimitExceeded(
                f"text is {len(text)} characters; the limit is {self.max_chars}",
                index=index,
                limit=self.max_chars,
            )
        if not text.strip():
            return InvalidText("text is empty or only whitespace", index=index)
        if not text.isascii():
            try:
                text.encode()
            except UnicodeEncodeError as exc:  # the tokenizers raise TypeError on these
                return InvalidText(
                    f"text holds a lone surrogate (U+{ord(text[exc.start]):04X} at character "
                    f"{exc.start}): not a Unicode character",
                    index=index,
                )
        return None

    async def tokenize(
        self,
        texts: Sequence[TextItem],
        indices: Sequence[int],
        tokenizer: Tokenizer,
        *,
        variant: Variant,
    ) -> TokenBatch:
        """Token rows for texts without a ``problem`` (``indices``: each one's index in the
        request); one pool task for them all. ``variant`` ``immich``: the texts cleaned as
        Immich's server cleans them (its /predict), not as open_clip does."""
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        rows, counts = await loop.run_in_executor(
            self._pool,
            functools.partial(tokenizer.tokenize_counted, variant=variant),
            [item.text for item in texts],
        )
        self._metrics.tokenize_seconds.observe(time.perf_counter() - started)
        self._metrics.texts.inc(len(texts))
        return TokenBatch(rows, tuple(indices), tuple(int(n) for n in counts))
