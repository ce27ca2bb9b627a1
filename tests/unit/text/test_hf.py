"""clip_gateway/text/hf.py against open_clip's own ``HFTokenizer`` (transformers underneath), both
pointed at the same locally built tokenizer directory of each real kind (tests/hf_tokenizers.py:
Gemma-style BPE for SigLIP2, T5-style Unigram for SigLIP, XLM-R-style Unigram): identical ids
over a generated corpus; negative controls that must fail; torch-free; missing files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tokenizers
from hypothesis import given, settings
from hypothesis import strategies as st

from clip_gateway.export import hf_tokenizer
from clip_gateway.export.tokenizer import describe
from clip_gateway.text import load_tokenizer
from clip_gateway.text.hf import HfTokenizer
from clip_gateway.text.tokenizer import canonicalize
from tests.hf_tokenizers import build
from tests.unit.text.test_tokenizer import corpus

ROOT = Path(__file__).resolve().parents[3]
CONTEXT = 64
#: kind, open_clip options: SigLIP2's and SigLIP's (their model configs), XLM-R's default
#: cleaning, XLM-R with ``strip_sep_token`` (its separator is its end token), and NLLB with a
#: language (open_clip's ``language``: its ``set_src_lang_special_tokens``)
CASES = {
    "gemma-siglip2": ("gemma", {"clean": "canonicalize"}),
    "t5-siglip": ("t5", {"clean": "canonicalize"}),
    "xlmr": ("xlmr", {}),
    "xlmr-strip-sep": ("xlmr", {"clean": "lower", "strip_sep_token": True}),
    "nllb-language": ("nllb", {"language": "fra_Latn"}),
}
SPECIAL_TEXTS = ["<pad>", "<eos>", "<bos>", "<unk>", "</s>", "<s>", "<mask>", "a </s> b",
                 "x<eos>y", "<0x41>", "▁", "▁▁a", "sea_waves", "a_b_c", "__init__"]  # fmt: skip


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """(the gateway's tokenizer from the exporter's file, open_clip's HFTokenizer), one kind."""
    kind, options = CASES[request.param]
    work = tmp_path_factory.mktemp(request.param)
    source = build(kind, work / "source")
    framing = hf_tokenizer.write(source, work, "tokenizer.json", CONTEXT, options)
    ours = load_tokenizer(
        "hf", str(work / "tokenizer.json"), CONTEXT,
        clean=framing["clean"], strip_sep_id=framing["strip_sep_id"],
    )  # fmt: skip
    return ours, hf_tokenizer.reference(source, CONTEXT, options), work


def differences(ours, theirs, texts: list[str]) -> list[str]:
    got, expected = ours.tokenize(texts), theirs(texts).numpy()
    assert got.shape == expected.shape == (len(texts), CONTEXT) and got.dtype == np.int32
    return [texts[i] for i in np.flatnonzero((got != expected).any(axis=1))]


def parity_corpus() -> list[str]:
    """Accents, CJK, emoji, punctuation and underscores, HTML entities, special-token strings,
    texts around and far past the context (tests/unit/text/test_tokenizer.py's corpus), more."""
    long = ["a photo of a cat " * n for n in (10, 15, 16, 17, 40)] + ["東京" * 100, "x" * 3000]
    return corpus(2000, seed=27) + SPECIAL_TEXTS + long


def test_ids_identical_to_open_clip_over_a_generated_corpus(pair) -> None:
    ours, theirs, _ = pair
    texts = parity_corpus()
    assert len(texts) > 2500
    assert differences(ours, theirs, texts) == []


@settings(max_examples=150, deadline=None)
@given(st.lists(st.text(), min_size=1, max_size=6))
def test_ids_identical_on_hypothesis_text(pair, texts: list[str]) -> None:
    ours, theirs, _ = pair
    assert differences(ours, theirs, texts) == []


def test_long_texts_are_truncated_and_short_ones_padded_as_open_clip_does(pair) -> None:
    ours, theirs, _ = pair
    rows, counts = ours.tokenize_counted(["a photo of a cat " * 40, "a cat"], variant="open_clip")
    expected = theirs(["a photo of a cat " * 40, "a cat"]).numpy()
    np.testing.assert_array_equal(rows, expected)
    pad = theirs.tokenizer.pad_token_id
    assert (rows[0] != pad).sum() >= CONTEXT - 1  # the long text fills the row
    assert rows[1, -1] == pad  # the short one is padded to the context
    assert CONTEXT < counts.sum() < 2 * CONTEXT  # padding is not counted


@pytest.mark.parametrize(
    "control", ["no cleaning", "wrong pad", "no truncation", "no sep strip", "lower, not canon"]
)
def test_negative_controls_fail(pair, control: str) -> None:
    """Each part of open_clip's framing changed on its own makes the parity check fail, so the
    check above can fail."""
    ours, theirs, work = pair
    texts = parity_corpus()
    backend = tokenizers.Tokenizer.from_file(str(work / "tokenizer.json"))
    if control == "no cleaning":
        ours = HfTokenizer(backend, CONTEXT, strip_sep_id=ours.strip_sep_id)
        ours._clean = lambda text: text
    elif control == "wrong pad":
        backend.enable_padding(pad_id=theirs.tokenizer.pad_token_id + 1, length=CONTEXT)
        ours = HfTokenizer(backend, CONTEXT, strip_sep_id=ours.strip_sep_id)
        ours._clean = pair[0]._clean
    elif control == "no truncation":
        # a file that pads but does not truncate gives rows longer than the graph takes
        backend.no_truncation()
        encodings = backend.encode_batch([pair[0]._clean(t) for t in texts])
        assert sum(len(e.ids) > CONTEXT for e in encodings) > 10
        return
    elif control == "no sep strip":
        if ours.strip_sep_id is None:
            pytest.skip("this case has no separator strip")
        ours = HfTokenizer(backend, CONTEXT, strip_sep_id=None)
        ours._clean = pair[0]._clean
    else:
        if pair[0]._clean is not canonicalize:
            pytest.skip("this case does not canonicalize")
        ours = HfTokenizer(backend, CONTEXT, clean="lower")
    assert differences(ours, theirs, texts) != []


def test_a_file_without_open_clips_padding_or_truncation_is_refused(pair) -> None:
    _, _, work = pair
    backend = tokenizers.Tokenizer.from_file(str(work / "tokenizer.json"))
    backend.enable_padding(length=32)
    with pytest.raises(ValueError, match="truncate to 32"):
        HfTokenizer(backend, 32)
    backend.no_padding()
    with pytest.raises(ValueError, match="pad to"):
        HfTokenizer(backend, CONTEXT)
    with pytest.raises(ValueError, match="no cleaning 'fancy'"):
        load_tokenizer("hf", str(work / "tokenizer.json"), CONTEXT, clean="fancy")
    with pytest.raises(ValueError, match="not one the gateway reproduces"):
        load_tokenizer("sentencepiece", str(work / "tokenizer.json"), CONTEXT)


def test_the_export_check_refuses_a_file_that_disagrees(tmp_path: Path) -> None:
    source = build("t5", tmp_path / "source")
    options = {"clean": "canonicalize"}
    hf_tokenizer.write(source, tmp_path, "tokenizer.json", CONTEXT, options)
    path = tmp_path / "tokenizer.json"
    assert hf_tokenizer.check(path, source, CONTEXT, options, ["a b"])["mismatches"] == 0
    wrong = tokenizers.Tokenizer.from_file(str(path))
    wrong.enable_padding(pad_id=0, pad_token="<pad>", length=CONTEXT)  # open_clip pads with </s>
    wrong.save(str(path))
    with pytest.raises(RuntimeError, match="refusing to serve text approximately"):
        hf_tokenizer.check(path, source, CONTEXT, options, ["a b"])


def test_missing_tokenizer_files_name_the_model_the_files_and_both_ways(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(hf_tokenizer.TokenizerFilesMissing) as missing:
        hf_tokenizer.find_source("ViT-B-16-SigLIP2", "timm/ViT-B-16-SigLIP2", tmp_path)
    message = str(missing.value)
    for part in ("ViT-B-16-SigLIP2", "'timm/ViT-B-16-SigLIP2'", "tokenizer.json",
                 "tokenizer_config.json", f"are not in {tmp_path}", "--tokenizer DIR",
                 "CLIP_TOKENIZER=DIR", "Hugging Face hub"):  # fmt: skip
        assert part in message
    # no directory: the hub, here unreachable and with no cache
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    with pytest.raises(hf_tokenizer.TokenizerFilesMissing, match="could not be fetched"):
        hf_tokenizer.find_source("ViT-B-16-SigLIP", "timm/ViT-B-16-SigLIP", None)


@pytest.mark.parametrize(
    ("model", "hf_name", "clean", "pooling"),
    [
        ("ViT-B-16-SigLIP", "timm/ViT-B-16-SigLIP", "canonicalize", "last"),
        ("ViT-B-16-SigLIP2", "timm/ViT-B-16-SigLIP2", "canonicalize", "last"),
        ("ViT-B-16-SigLIP2-256", "timm/ViT-B-16-SigLIP2-256", "canonicalize", "last"),
        ("ViT-B-16-SigLIP-i18n-256", "timm/ViT-B-16-SigLIP-i18n-256", "canonicalize", "last"),
        ("xlm-roberta-base-ViT-B-32", "xlm-roberta-base", None, "mean_pooler"),
        ("nllb-clip-base-siglip", "facebook/nllb-200-distilled-600M", None, "cls_pooler"),
    ],
)
def test_every_hf_family_is_described_as_served(
    model: str, hf_name: str, clean: str | None, pooling: str
) -> None:
    info = describe(model)
    assert (info.kind, info.available, info.hf_name, info.pooling) == ("hf", True, hf_name, pooling)
    assert info.options.get("clean") == clean


def test_the_serving_modules_import_neither_torch_nor_transformers() -> None:
    code = (
        "import sys, clip_gateway.text.hf, clip_gateway.text, clip_gateway.pipeline.texts\n"
        "bad = [m for m in ('torch', 'transformers', 'open_clip') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
