"""open_clip's CLIP BPE tokenizer (``SimpleTokenizer``) without torch, token for token.

Three stages, as open_clip runs them:

1. cleaning, in Python (``clean``): ftfy's ``fix_text``, HTML entities unescaped twice, runs of
   whitespace collapsed to one space, trimmed, lower-cased;
2. Hugging Face ``tokenizers`` from the ``tokenizer.json`` the exporter wrote
   (clip_gateway/export/tokenizer.py): open_clip's pre-tokenisation regex (its character classes
   frozen at export from the ``regex`` module open_clip uses, so the Unicode tables are the same),
   byte-level mapping, BPE with ``</w>`` word ends;
3. framing (``tokenize``): ``<start_of_text>``, the ids, ``<end_of_text>``, truncated to the
   context length keeping ``<end_of_text>`` last, zero padding.

A text may itself contain ``<start_of_text>`` or ``<end_of_text>``: open_clip's regex turns them
into the special ids where a token starts there (not inside a run of punctuation), so such texts
take a slower path that walks the pre-tokens and maps those to the special ids.
"""

from __future__ import annotations

import html
import string
import unicodedata
from collections.abc import Callable, Sequence
from pathlib import Path

import ftfy
import numpy as np
import tokenizers

from clip_gateway.text import Variant

START_OF_TEXT = "<start_of_text>"
END_OF_TEXT = "<end_of_text>"


def _basic(text: str) -> str:
    """open_clip's ``basic_clean`` without its strip (every cleaning below strips anyway)."""
    return html.unescape(html.unescape(ftfy.fix_text(text)))


def clean(text: str) -> str:
    """open_clip's ``lower`` cleaning (``basic_clean``, ``whitespace_clean``, ``lower``).

    ``str.split()`` with no argument splits on the same whitespace ``str.strip()`` trims, so one
    split-and-join does both of open_clip's strips and its collapse.
    """
    return " ".join(_basic(text).split()).lower()


def clean_whitespace(text: str) -> str:
    """open_clip's ``whitespace`` cleaning, HFTokenizer's default: ``lower`` minus lower-casing."""
    return " ".join(_basic(text).split())


def clean_whitespace_underscore(text: str) -> str:
    """open_clip's ``whitespace_underscore`` (open_clip 4): underscores become spaces first."""
    return " ".join(_basic(text).replace("_", " ").split())


_NO_PUNCTUATION = str.maketrans("", "", string.punctuation)


def canonicalize(text: str) -> str:
    """open_clip's ``canonicalize`` (big_vision's): underscores to spaces, ASCII punctuation
    removed, lower-cased, whitespace collapsed (SigLIP and SigLIP2)."""
    stripped = _basic(text).strip().replace("_", " ").translate(_NO_PUNCTUATION)
    return " ".join(stripped.lower().split())


#: open_clip's cleaning functions by the name its ``tokenizer_kwargs`` give (``get_clean_fn``).
CLEANERS: dict[str, Callable[[str], str]] = {
    "lower": clean,
    "whitespace": clean_whitespace,
    "whitespace_underscore": clean_whitespace_underscore,
    "canonicalize": canonicalize,
}


def clean_immich(text: str, canonicalize: bool = False) -> str:
    """Immich's ``clean_text``: whitespace runs to one space, trimmed; for models whose
    ``tokenizer_kwargs.clean`` is ``canonicalize`` (SigLIP's), then ASCII punctuation removed and
    lower case. Unlike open_clip's ``canonicalize_text``, ``_`` is removed, not made a space, and
    removing punctuation may leave double spaces."""
    text = " ".join(text.split())
    return text.translate(_NO_PUNCTUATION).lower() if canonicalize else text


def _clean_immich_bpe(text: str) -> str:
    """What Immich's server does to a query before its ids, for OpenAI's CLIP BPE: its
    ``clean_text``, then the normaliser of the ``tokenizer.json`` it loads from the Hugging Face
    hub (NFC, lower case). No ftfy, no HTML unescaping: ``&amp;`` stays five characters, as
    Immich embeds it."""
    return unicodedata.normalize("NFC", clean_immich(text)).lower()


class ClipBpeTokenizer:
    """Texts to open_clip's token ids: ``int32 [n, context_length]``."""

    def __init__(self, tokenizer: tokenizers.Tokenizer, context_length: int) -> None:
        if context_length < 2:
            raise ValueError(f"context_length must leave room for start and end: {context_length}")
        ids = [tokenizer.token_to_id(token) for token in (START_OF_TEXT, END_OF_TEXT)]
        if None in ids or tokenizer.pre_tokenizer is None:
            raise ValueError(
                "not a CLIP BPE tokenizer file (clip_gateway/export/tokenizer.py writes one)"
            )
        self._tokenizer = tokenizer
        self._pre_tokenizer = tokenizer.pre_tokenizer
        self.context_length = context_length
        self.start_id, self.end_id = (int(i) for i in ids if i is not None)
        self._specials = {START_OF_TEXT: self.start_id, END_OF_TEXT: self.end_id}

    @classmethod
    def from_file(cls, path: str | Path, context_length: int) -> ClipBpeTokenizer:
        return cls(tokenizers.Tokenizer.from_file(str(path)), context_length)

    def tokenize(self, texts: Sequence[str], cleaning: Callable[[str], str] = clean) -> np.ndarray:
        """Token ids for each text, one row each; empty or blank text is start + end only.
        ``cleaning``: open_clip's (``clean``) or Immich's (``_clean_immich_bpe``)."""
        cleaned = [cleaning(text) for text in texts]
        plain = [i for i, text in enumerate(cleaned) if not self._has_special(text)]
        bodies: list[list[int]] = [[] for _ in cleaned]
        encodings = self._tokenizer.encode_batch(
            [cleaned[i] for i in plain], add_special_tokens=False
        )
        for i, encoding in zip(plain, encodings, strict=True):
            bodies[i] = encoding.ids
        for i, text in enumerate(cleaned):
            if self._has_special(text):
                bodies[i] = self._tokenize_with_specials(text)
        rows = np.zeros((len(cleaned), self.context_length), dtype=np.int32)
        keep = self.context_length - 2
        for row, body in zip(rows, bodies, strict=True):
            # open_clip truncates [start, *body, end] to the context and puts end back last
            ids = [self.start_id, *body[:keep], self.end_id]
            row[: len(ids)] = ids
        return rows

    def tokenize_counted(
        self, texts: Sequence[str], *, variant: Variant
    ) -> tuple[np.ndarray, np.ndarray]:
        """``tokenize`` and the tokens the model reads of each row (start and end included,
        padding not): each row ends with the end token, truncated texts keep it last.
        ``variant`` ``immich``: the texts cleaned as Immich's server cleans them (its /predict)."""
        rows = self.tokenize(texts, _clean_immich_bpe if variant == "immich" else clean)
        return rows, np.argmax(rows == self.end_id, axis=1) + 1

    @staticmethod
    def _has_special(text: str) -> bool:
        return START_OF_TEXT in text or END_OF_TEXT in text

    def _tokenize_with_specials(self, text: str) -> list[int]:
        # The pre-tokenizer's regex has open_clip's special-token alternatives first, so a special
        # is its own pre-token exactly where open_clip's findall matches it; everything else goes
        # through the BPE model as tokenize would send it.
        ids: list[int] = []
        for piece, _ in self._pre_tokenizer.pre_tokenize_str(text):
            special = self._specials.get(piece)
            if special is not None:
                ids.append(special)
            else:
                ids.extend(token.id for token in self._tokenizer.model.tokenize(piece))
        return ids
