"""open_clip's ``HFTokenizer`` (SigLIP, SigLIP2, the multilingual towers) without torch or
transformers, token for token.

open_clip runs, per batch of texts: its cleaning function (``canonicalize`` for SigLIP and SigLIP2,
``whitespace`` by default; ``clip_gateway.text.tokenizer.CLEANERS``), then the transformers
tokenizer with ``padding='max_length', truncation=True, max_length=context_length``, then, with
``strip_sep_token``, every separator id replaced by 0. A transformers "fast" tokenizer is a Hugging
Face ``tokenizers`` tokenizer underneath (its ``backend_tokenizer``) whose special tokens,
post-processor (BOS/EOS, language codes) and padding/truncation transformers sets at load and at
call time; the exporter (clip_gateway/export/tokenizer.py) saves that backend, with the padding and
truncation of open_clip's call set on it, as the ``tokenizer.json`` this module loads. What stays in
Python is what transformers does not do: the cleaning and the separator strip.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import tokenizers

from clip_gateway.text import Variant
from clip_gateway.text.tokenizer import CLEANERS, clean_immich

#: The tokenizer kind (``clip_text``'s ``tokenizer`` parameter, the manifest's ``kind``).
HF_KIND = "hf"


class HfTokenizer:
    """Texts to open_clip's ``HFTokenizer`` ids: ``int32 [n, context_length]``."""

    def __init__(
        self,
        tokenizer: tokenizers.Tokenizer,
        context_length: int,
        *,
        clean: str = "whitespace",
        strip_sep_id: int | None = None,
    ) -> None:
        if clean not in CLEANERS:
            raise ValueError(f"open_clip has no cleaning {clean!r} (known: {sorted(CLEANERS)})")
        padding, truncation = tokenizer.padding, tokenizer.truncation
        if padding is None or padding.get("length") != context_length:
            raise ValueError(f"the tokenizer file does not pad to {context_length} tokens")
        if truncation is None or truncation.get("max_length") != context_length:
            raise ValueError(f"the tokenizer file does not truncate to {context_length} tokens")
        self._tokenizer = tokenizer
        self._clean = CLEANERS[clean]
        # Immich's clean_text: its own whitespace collapse, and for a canonicalize model its own
        # punctuation removal and lower-casing (docs/IMMICH.md)
        self._immich_canonicalize = clean == "canonicalize"
        self.context_length = context_length
        self.strip_sep_id = strip_sep_id

    @classmethod
    def from_file(
        cls,
        path: str | Path,
        context_length: int,
        *,
        clean: str = "whitespace",
        strip_sep_id: int | None = None,
    ) -> HfTokenizer:
        tokenizer = tokenizers.Tokenizer.from_file(str(path))
        return cls(tokenizer, context_length, clean=clean, strip_sep_id=strip_sep_id)

    def tokenize(self, texts: Sequence[str]) -> np.ndarray:
        """Token ids for each text, one row each, padded and truncated to the context."""
        return self.tokenize_counted(texts, variant="open_clip")[0]

    def tokenize_counted(
        self, texts: Sequence[str], *, variant: Variant
    ) -> tuple[np.ndarray, np.ndarray]:
        """``tokenize`` and the tokens the model reads of each row (padding not counted).
        ``variant`` ``immich``: cleaned as Immich's server cleans a query, not as open_clip does."""
        rows = np.zeros((len(texts), self.context_length), dtype=np.int32)
        if not texts:
            return rows, np.zeros(0, dtype=np.int64)
        if variant == "immich":
            cleaned = [clean_immich(text, self._immich_canonicalize) for text in texts]
        else:
            cleaned = [self._clean(text) for text in texts]
        encodings = self._tokenizer.encode_batch(cleaned, add_special_tokens=True)
        rows[:] = [encoding.ids for encoding in encodings]
        counts = np.array([sum(encoding.attention_mask) for encoding in encodings])
        if self.strip_sep_id is not None:
            rows[rows == self.strip_sep_id] = 0
        return rows, counts
