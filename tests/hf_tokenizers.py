"""Small Hugging Face tokenizers of each kind open_clip's HFTokenizer loads for a real model,
built here with ``tokenizers`` (no hub) and saved as tokenizer directories, as on the hub:

- ``gemma``: SigLIP2's kind, a SentencePiece-style BPE (spaces as ``▁``, byte fallback, no
  pre-tokenizer), ``GemmaTokenizer`` with ``<pad>`` 0, ``<eos>`` 1, ``<bos>`` 2, ``<unk>`` 3;
- ``t5``: SigLIP's kind, a T5-style Unigram (Metaspace, ``</s>`` appended), ``T5Tokenizer`` with
  ``<pad>`` 0, ``</s>`` 1, ``<unk>`` 2, and ``</s>`` as its pad token, as open_clip sets it;
- ``xlmr``: the multilingual towers' kind, an XLM-R-style Unigram (``<s> … </s>``),
  ``XLMRobertaTokenizer`` with ``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3, ``<mask>`` last;
- ``nllb``: NLLB's kind, the same Unigram with language codes (``eng_Latn``, ``fra_Latn``) as
  special tokens, ``NllbTokenizer`` prefixing the source language's code.

Trained on a seeded corpus of every script and symbol the parity corpus uses, so most texts
split into many pieces and some need the unknown token or byte fallback.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

KINDS = ("gemma", "t5", "xlmr", "nllb")
VOCAB = 1200

_TRAINING = [
    "a photo of a cat", "a photo of a dog", "the quick brown fox jumps over the lazy dog",
    "naïve café résumé Ångström façade São Paulo Zürich crème brûlée", "東京の夜景 北京烤鸭",
    "서울 야경 カタカナ 漢字かな交じり文", "Ελληνικά Кириллица עברית العربية हिन्दी ไทย",
    "It's a DOG's life, isn't it? we're they've don't", "1234567890 3.14159 2024-01-01",
    "sea_waves snake_case_label", "hello world! (parentheses) [brackets] {braces}",
    "😀 👍🏽 🇫🇷 ❤️", "&amp; &lt;b&gt; <p>para</p>", "über schön straße",
]  # fmt: skip


def _corpus(seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    words = " ".join(_TRAINING).split()
    return _TRAINING + [" ".join(rng.choices(words, k=rng.randint(3, 12))) for _ in range(3000)]


def build(kind: str, directory: Path) -> Path:
    """Write a tokenizer directory of ``kind`` (tokenizer.json, tokenizer_config.json,
    special_tokens_map.json) and return it."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer, config = {"gemma": _gemma, "t5": _t5, "xlmr": _xlmr, "nllb": _nllb}[kind]()
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    specials = {k: v for k, v in config.items() if k.endswith("_token") and isinstance(v, str)}
    (directory / "special_tokens_map.json").write_text(json.dumps(specials, indent=1))
    return directory


def _gemma():  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer, decoders, models, normalizers, processors, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tokenizer.normalizer = normalizers.Replace(" ", "▁")
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB + 256,
        special_tokens=["<pad>", "<eos>", "<bos>", "<unk>"],
        initial_alphabet=["▁"],
    )
    tokenizer.train_from_iterator(_corpus(), trainer)
    tokenizer.add_tokens([f"<0x{b:02X}>" for b in range(256)])  # byte fallback pieces
    tokenizer.post_processor = processors.TemplateProcessing(
        single="$A <eos>", special_tokens=[("<eos>", 1)]
    )
    config = {
        "tokenizer_class": "GemmaTokenizer", "add_bos_token": False, "add_eos_token": True,
        "pad_token": "<pad>", "eos_token": "<eos>", "bos_token": "<bos>", "unk_token": "<unk>",
        "padding_side": "right", "model_max_length": 64,
    }  # fmt: skip
    return tokenizer, config


def _unigram(specials: list[str], unk: str):  # type: ignore[no-untyped-def]
    """A Unigram model from the corpus' counts (``UnigramTrainer`` is not deterministic from
    run to run, and the export cache keys a tokenizer directory by its content): every
    character, then the most frequent word-start pieces and inner pieces of 2-6 characters,
    scored by log frequency."""
    import math
    import unicodedata
    from collections import Counter

    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    counts: Counter[str] = Counter()
    for text in _corpus():
        for word in unicodedata.normalize("NFKC", text).split():
            word = "▁" + word
            for size in range(1, 7):
                counts.update(word[i : i + size] for i in range(len(word) - size + 1))
    singles = sorted(piece for piece in counts if len(piece) == 1)
    longer = sorted((p for p in counts if len(p) > 1), key=lambda p: (-counts[p], p))
    pieces = singles + longer[: VOCAB - len(specials) - len(singles)]
    total = sum(counts[p] for p in pieces)
    vocab = [(token, 0.0) for token in specials]
    vocab += [(p, math.log(counts[p] / total) - (10.0 if len(p) == 1 else 0.0)) for p in pieces]
    tokenizer = Tokenizer(models.Unigram(vocab, unk_id=specials.index(unk), byte_fallback=False))
    tokenizer.add_special_tokens(specials)
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.NFKC(), normalizers.Replace(" {2,}", " ")]
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    return tokenizer


def _t5():  # type: ignore[no-untyped-def]
    from tokenizers import processors

    tokenizer = _unigram(["<pad>", "</s>", "<unk>"], "<unk>")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 1)]
    )
    config = {
        "tokenizer_class": "T5Tokenizer", "eos_token": "</s>", "unk_token": "<unk>",
        "pad_token": "</s>", "extra_ids": 0, "model_max_length": 64,
    }  # fmt: skip
    return tokenizer, config


def _xlmr():  # type: ignore[no-untyped-def]
    from tokenizers import processors

    tokenizer = _unigram(["<s>", "<pad>", "</s>", "<unk>"], "<unk>")
    tokenizer.add_special_tokens(["<mask>"])
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)],
    )
    config = {
        "tokenizer_class": "XLMRobertaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
        "sep_token": "</s>", "cls_token": "<s>", "unk_token": "<unk>", "pad_token": "<pad>",
        "mask_token": "<mask>", "model_max_length": 512,
    }  # fmt: skip
    return tokenizer, config


def _nllb():  # type: ignore[no-untyped-def]
    from tokenizers import processors

    tokenizer = _unigram(["<s>", "<pad>", "</s>", "<unk>"], "<unk>")
    tokenizer.add_special_tokens(["eng_Latn", "fra_Latn", "<mask>"])
    english = tokenizer.token_to_id("eng_Latn")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="eng_Latn $A </s>", special_tokens=[("eng_Latn", english), ("</s>", 2)]
    )
    config = {
        "tokenizer_class": "NllbTokenizer", "bos_token": "<s>", "eos_token": "</s>",
        "sep_token": "</s>", "cls_token": "<s>", "unk_token": "<unk>", "pad_token": "<pad>",
        "mask_token": "<mask>", "src_lang": "eng_Latn",
        "additional_special_tokens": ["eng_Latn", "fra_Latn"], "model_max_length": 1024,
    }  # fmt: skip
    return tokenizer, config
