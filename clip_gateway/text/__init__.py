"""Text input for the text tower: open_clip's tokenizers, reproduced without torch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol

import numpy as np

#: Whose cleaning a text gets before its ids: open_clip's (the model's own, from its tokenizer
#: options) or Immich's ML server's (its /predict, docs/IMMICH.md). The same values as imaging's
#: ``Variant`` (its preprocessing): the pipeline passes one value to both.
Variant = Literal["open_clip", "immich"]


class Tokenizer(Protocol):
    """What the pipeline needs of a model's tokenizer, whichever open_clip kind it reproduces."""

    context_length: int

    def tokenize(self, texts: Sequence[str]) -> np.ndarray:
        """int32 ``[n, context_length]`` token ids, one row per text."""
        ...

    def tokenize_counted(
        self, texts: Sequence[str], *, variant: Variant
    ) -> tuple[np.ndarray, np.ndarray]:
        """``tokenize`` and the tokens the model reads of each row (padding not counted).
        ``variant`` ``immich``: cleaned as Immich's server cleans a query (its /predict), not as
        open_clip does; the tokenizer file's own normaliser and framing apply either way."""
        ...


def load_tokenizer(
    kind: str,
    path: str,
    context_length: int,
    *,
    clean: str | None = None,
    strip_sep_id: int | None = None,
) -> Tokenizer:
    """The tokenizer of ``kind`` (``clip_bpe`` or ``hf``) from the exporter's file; ValueError
    for a kind or a file the gateway cannot use."""
    from clip_gateway.text.hf import HF_KIND, HfTokenizer
    from clip_gateway.text.tokenizer import ClipBpeTokenizer

    if kind == "clip_bpe":
        if clean not in (None, "lower"):
            raise ValueError(f"open_clip's CLIP BPE with cleaning {clean!r} is not reproduced")
        return ClipBpeTokenizer.from_file(path, context_length)
    if kind == HF_KIND:
        return HfTokenizer.from_file(
            path, context_length, clean=clean or "whitespace", strip_sep_id=strip_sep_id
        )
    raise ValueError(f"tokenizer kind {kind!r} is not one the gateway reproduces")
