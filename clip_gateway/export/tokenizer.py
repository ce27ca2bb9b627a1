"""Which tokenizer a model's text tower takes, and for open_clip's CLIP BPE the ``tokenizer.json``
the gateway loads without torch (clip_gateway/text/tokenizer.py), checked against open_clip at
export.

The file holds open_clip's vocabulary and merges as a Hugging Face ``tokenizers`` BPE model with
``</w>`` word ends, and open_clip's pre-tokenisation regex. That regex uses Unicode classes
(``\\p{L}``, ``\\p{N}``, ``\\s``) under IGNORECASE; ``tokenizers``' regex engine (Oniguruma) has
older Unicode tables than the ``regex`` module open_clip runs (17,144 letters it does not know as
letters), so every class is written out as the explicit code points ``regex`` matches with
open_clip's flags, probed here, and every literal letter as the characters IGNORECASE lets it
match (``'s`` also matches an apostrophe and a long s, U+017F). The cleaning open_clip does before
the regex stays in Python (``clip_gateway.text.tokenizer.clean``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import regex
from open_clip.tokenizer import SimpleTokenizer

from clip_gateway.model.contract import CLIP_BPE
from clip_gateway.text.tokenizer import END_OF_TEXT, START_OF_TEXT, ClipBpeTokenizer

if TYPE_CHECKING:
    from clip_gateway.text import Tokenizer

DEFAULT_CONTEXT_LENGTH = 77
#: open_clip's regex after its special tokens (open_clip/tokenizer.py, SimpleTokenizer.__init__).
CONTRACTIONS = ("'s", "'t", "'re", "'ve", "'m", "'ll", "'d")
_MAX_CODE_POINT = 0x10FFFF


@dataclass(frozen=True)
class TokenizerInfo:
    """What the manifest says about the text side: kind, context length, why not (if not)."""

    kind: str
    context_length: int
    #: None when the gateway can tokenise for this model; else the sentence a text request gets.
    unavailable_reason: str | None = None
    #: The Hugging Face tokenizer's name, for those.
    hf_name: str | None = None
    #: open_clip's ``tokenizer_kwargs`` for HFTokenizer (``clean``, ``strip_sep_token``...).
    options: dict[str, Any] = field(default_factory=dict, compare=False)
    #: How the text graph pools its tokens (``argmax``, ``last``...; HF towers: their pooler).
    pooling: str | None = field(default=None, compare=False)

    @property
    def available(self) -> bool:
        return self.unavailable_reason is None


#: open_clip's HFTokenizer options the gateway reproduces (clip_gateway/text/hf.py).
HF_OPTIONS = {"clean", "strip_sep_token", "language"}


def describe(model_name: str) -> TokenizerInfo:
    """The tokenizer ``open_clip.get_tokenizer(model_name)`` would build, decided the same way
    (from the model's ``text_cfg``), without building it: HF tokenizers would go to the hub."""
    import open_clip

    from clip_gateway.text.tokenizer import CLEANERS

    text_cfg = (open_clip.get_model_config(model_name) or {}).get("text_cfg", {})
    context_length = int(text_cfg.get("context_length", DEFAULT_CONTEXT_LENGTH))
    options = dict(text_cfg.get("tokenizer_kwargs", {}))
    pooling = text_cfg.get("hf_pooler_type") or text_cfg.get("pool_type") or "argmax"
    if hf_name := text_cfg.get("hf_tokenizer_name"):
        unsupported = {k: v for k, v in options.items() if k not in HF_OPTIONS}
        if mode := text_cfg.get("tokenizer_mode"):
            unsupported["tokenizer_mode"] = mode
        if options.get("clean", "whitespace") not in CLEANERS:
            unsupported["clean"] = options["clean"]
        reason = None
        if unsupported:
            reason = (
                f"{model_name}'s Hugging Face tokenizer {hf_name!r} takes open_clip options "
                f"{unsupported} that the gateway does not reproduce, so this model serves "
                "images only"
            )
        return TokenizerInfo("hf", context_length, reason, hf_name, options, pooling)
    if "siglip" in model_name.lower():
        return TokenizerInfo(
            "siglip",
            context_length,
            f"{model_name} uses open_clip's SigLipTokenizer (a SentencePiece model downloaded "
            "from Google storage, no Hugging Face name); the gateway reproduces open_clip's CLIP "
            "BPE and HFTokenizer only, so this model serves images only",
        )
    unsupported = {k: v for k, v in options.items() if (k, v) != ("clean", "lower")}
    if unsupported:
        return TokenizerInfo(
            CLIP_BPE,
            context_length,
            f"{model_name}'s CLIP BPE tokenizer takes options {unsupported} that the gateway "
            "does not reproduce (it reproduces the default: clean='lower', no reduction), so "
            "this model serves images only",
        )
    return TokenizerInfo(CLIP_BPE, context_length, pooling=pooling)


def write_clip_bpe(path: Path) -> None:
    """open_clip's default ``SimpleTokenizer`` as a ``tokenizers`` file (see the module doc)."""
    from tokenizers import Regex, models, pre_tokenizers
    from tokenizers import Tokenizer as HfTokenizer

    simple = SimpleTokenizer()
    merges = sorted(simple.bpe_ranks, key=simple.bpe_ranks.__getitem__)
    bpe = models.BPE(vocab=simple.encoder, merges=merges, end_of_word_suffix="</w>")
    tokenizer = HfTokenizer(bpe)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            # invert: the pattern matches the tokens and whatever it skips (whitespace) goes
            pre_tokenizers.Split(Regex(clip_pattern()), behavior="removed", invert=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.save(str(path))


def clip_pattern() -> str:
    """open_clip's pre-tokenisation regex with every class and folded letter spelt out."""
    # Each class probed on its own under IGNORECASE, never derived from another: regex does not
    # complement consistently under it (U+0345, which folds to a Greek letter, is in neither
    # [\p{L}] nor [^\s\p{L}\p{N}], so open_clip drops it).
    letters = _ranges(r"[\p{L}]", regex.IGNORECASE)
    numbers = _ranges(r"[\p{N}]", regex.IGNORECASE)
    others = _ranges(r"[^\s\p{L}\p{N}]", regex.IGNORECASE)
    alternatives = [_literal(token) for token in (START_OF_TEXT, END_OF_TEXT, *CONTRACTIONS)]
    alternatives += [f"{_class(letters)}+", _class(numbers), f"{_class(others)}+"]
    return "|".join(alternatives)


@cache
def _all_characters() -> str:
    return "".join(chr(c) for c in range(_MAX_CODE_POINT + 1) if not 0xD800 <= c <= 0xDFFF)


@cache
def _ranges(pattern: str, flags: int = 0) -> list[tuple[int, int]]:
    """The code points ``pattern`` matches one at a time under open_clip's ``regex``, as ranges."""
    points = sorted({ord(match) for match in regex.findall(pattern, _all_characters(), flags)})
    ranges: list[tuple[int, int]] = []
    for point in points:
        if ranges and ranges[-1][1] == point - 1:
            ranges[-1] = (ranges[-1][0], point)
        else:
            ranges.append((point, point))
    return ranges


def _class(ranges: list[tuple[int, int]]) -> str:
    def char(point: int) -> str:
        return f"\\x{{{point:X}}}"

    return "[" + "".join(char(a) if a == b else f"{char(a)}-{char(b)}" for a, b in ranges) + "]"


def _literal(text: str) -> str:
    """``text`` as open_clip's IGNORECASE regex matches it: each character as its fold class."""
    return "".join(_class(_ranges(regex.escape(char), regex.IGNORECASE)) for char in text)


def check_against_open_clip(path: Path, context_length: int, texts: list[str]) -> dict[str, Any]:
    """Token ids from the written file vs open_clip's own tokenizer; raises on any difference."""
    ours = ClipBpeTokenizer.from_file(path, context_length).tokenize(texts)
    reference = SimpleTokenizer(context_length=context_length)(texts).numpy()
    differ = np.flatnonzero((ours != reference).any(axis=1))
    if len(differ):
        first = texts[int(differ[0])]
        raise RuntimeError(
            f"the exported tokenizer disagrees with open_clip on {len(differ)} of {len(texts)} "
            f"texts, e.g. {first!r}: refusing to serve text approximately"
        )
    return {"texts": len(texts), "mismatches": 0}


def self_check_texts(count: int = 400, seed: int = 0) -> list[str]:
    """Fixed tricky texts plus seeded random ones from every Unicode plane in use."""
    rng = random.Random(seed)
    fixed = [
        "a photo of a cat", "", "   ", "It's a DOG's life, isn't it?", "naïve café résumé",
        "東京の夜景", "😀 👍🏽 🇫🇷", "&amp;lt;b&amp;gt; &quot;x&quot;", "tab\there\nnewline",
        "x" * 500, "1234567890 3.14159", "'\u017f ǅ İstanbul ß", START_OF_TEXT + "a" + END_OF_TEXT,
        "!" + END_OF_TEXT, "<\u017ftart_of_text>", "a" + END_OF_TEXT * 3,
    ]  # fmt: skip
    random_texts = [
        "".join(chr(rng.choice(_PLANES)(rng)) for _ in range(rng.randint(0, 80)))
        for _ in range(count - len(fixed))
    ]
    return fixed + random_texts


_PLANES = (
    lambda rng: rng.randint(0x20, 0x7E),
    lambda rng: rng.randint(0xA0, 0x2FFF),
    lambda rng: rng.randint(0x3000, 0x9FFF),
    lambda rng: rng.randint(0x1F300, 0x1FAFF),
    lambda rng: rng.choice((0x20, 0x09, 0x0A, 0xA0, 0x3000)),
)


def served_tokenizer(directory: Path, described: dict[str, Any]) -> Tokenizer:
    """The gateway's tokenizer for an export, as the served model loads it."""
    from clip_gateway.text import load_tokenizer

    return load_tokenizer(
        described["kind"],
        str(directory / described["file"]),
        described["context_length"],
        clean=described.get("clean"),
        strip_sep_id=described.get("strip_sep_id"),
    )


def reference_tokenizer(directory: Path, manifest: dict[str, Any]) -> Any:
    """open_clip's own tokenizer for an export: ``get_tokenizer`` for its CLIP BPE, its
    HFTokenizer on the files the export keeps for a Hugging Face one (no hub needed)."""
    import open_clip

    from clip_gateway.export import hf_tokenizer

    described = manifest["tokenizer"]
    if described["kind"] != "hf":
        return open_clip.get_tokenizer(manifest["model"])
    options = open_clip.get_model_config(manifest["model"])["text_cfg"].get("tokenizer_kwargs", {})
    return hf_tokenizer.reference(
        directory / hf_tokenizer.SOURCE_DIR, described["context_length"], dict(options)
    )
