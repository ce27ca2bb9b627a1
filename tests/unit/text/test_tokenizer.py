"""clip_gateway/text/tokenizer.py against open_clip's own tokenizer: identical token ids over a
corpus generated here (thousands of texts) and hypothesis-generated text; torch-free; framing."""

from __future__ import annotations

import lzma
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import open_clip
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clip_gateway.export.tokenizer import write_clip_bpe
from clip_gateway.text.tokenizer import ClipBpeTokenizer, clean
from tests import tokenizer_data

ROOT = Path(__file__).resolve().parents[3]
CONTEXT = 77

ACCENTED = ["naïve", "café", "Ångström", "façade", "São Paulo", "Zürich", "crème brûlée",
            "ÉCOLE", "Dvořák", "Łódź", "İstanbul", "Straße", "ǅemal", "ﬁne", "e\u0301", "\u0345",
            "Ελληνικά", "Кириллица", "עברית", "العربية", "हिन्दी", "ไทย"]  # fmt: skip
CJK = ["東京の夜景", "北京烤鸭", "서울 야경", "カタカナ", "漢字かな交じり文", "中文\uff0c标点。",
       "全角ＡＢＣ１２３", "ｶﾀｶﾅ"]  # fmt: skip
EMOJI = ["😀", "👍🏽", "👨\u200d👩\u200d👧", "🇫🇷", "❤️", "🐈\u200d⬛", "1️⃣", "🫥"]
HTML = ["&amp;", "&lt;b&gt;bold&lt;/b&gt;", "&amp;amp;lt;", "&#39;", "&#x27;", "&quot;q&quot;",
        "&nbsp;", "<p>para</p>", "&copy; 2024", "&notanentity;", "&amp;#128512;",
        "&eacute;"]  # fmt: skip
SPACES = ["\t", "\n", "\r\n", "  ", "\u00a0", "\u2003", "\u3000", "\u0085", "\x0b", "\x0c",
          "\u200b", "\u2028", " \t \n "]  # fmt: skip
NUMBERS = ["0", "42", "3.14159", "1,000,000", "١٢٣", "½", "²", "Ⅻ", "2024-01-01", "+1 (555) 010"]
PUNCT = ["!", "?!", "...", "—", "«»", "“quotes”", "'", "''", "--", "@#$%^&*()", "<>", "_", "\\|~"]
WORDS = ["a photo of a cat", "A PHOTO OF A DOG", "MiXeD CaSe", "It's", "I'LL", "we're",
         "they've", "don't", "'s", "'S", "y'all'd", "'\u017f"]  # fmt: skip
MOJIBAKE = ["cafÃ©", "â€œquotedâ€\x9d", "Ã¼ber", "SchÃ¶n"]
SPECIALS = ["<start_of_text>", "<end_of_text>", "<END_OF_TEXT>", "<\u017ftart_of_text>",
            "!<end_of_text>", "x<end_of_text>y", "<end_of_text><end_of_text>",
            "<end_of_text"]  # fmt: skip
CONTROL = ["\x00", "\x1b[31m", "\u202e", "\ufeff", "\ufffd", "\x7f"]
POOLS = [ACCENTED, CJK, EMOJI, HTML, NUMBERS, PUNCT, WORDS, MOJIBAKE, SPECIALS, CONTROL]


def corpus(count: int = 4000, seed: int = 16) -> list[str]:
    """Fragments of every kind joined by every kind of whitespace, long texts around the
    truncation point and far past it, and random code points from all of Unicode."""
    rng = random.Random(seed)
    texts = [
        "".join(
            rng.choice(rng.choice(POOLS)) + rng.choice([*SPACES, " ", " ", ""])
            for _ in range(rng.randint(1, 8))
        )
        for _ in range(count)
    ]
    words = [rng.choice(WORDS + ACCENTED + CJK) for _ in range(200)]
    texts += [" ".join(words[:n]) for n in range(20, 120, 3)]  # around and past 75 tokens
    texts += ["x" * n for n in (74, 75, 76, 77, 78, 500)] + ["😀" * 100, "a, " * 1000]
    texts += [
        "".join(chr(rng.choice(_CODE_POINTS)) for _ in range(rng.randint(0, 60)))
        for _ in range(500)
    ]
    return [*texts, "", " ", "\t\n", "\u3000", "&nbsp;"]


_CODE_POINTS = [c for c in range(0x20, 0x30000) if not 0xD800 <= c <= 0xDFFF]


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    write_clip_bpe(path)
    return path


@pytest.fixture(scope="module")
def ours(tokenizer_file: Path) -> ClipBpeTokenizer:
    return ClipBpeTokenizer.from_file(tokenizer_file, CONTEXT)


def test_the_fixtures_copy_is_what_the_exporter_writes_from_this_open_clip(
    tokenizer_file: Path,
) -> None:
    """The API and unit fixtures load a committed copy (tests/data/) so they need no open_clip;
    when the exporter or open_clip changes, run `python -m tests.tokenizer_data`."""
    committed = lzma.decompress(tokenizer_data.COMPRESSED.read_bytes())
    assert committed == tokenizer_file.read_bytes(), "stale: python -m tests.tokenizer_data"
    assert tokenizer_data.SOURCE.read_text() == tokenizer_data.source_line()


@pytest.fixture(scope="module")
def theirs():
    return open_clip.get_tokenizer("ViT-B-32")


def differences(ours: ClipBpeTokenizer, theirs, texts: list[str]) -> list[str]:
    got, expected = ours.tokenize(texts), theirs(texts).numpy()
    assert got.shape == expected.shape == (len(texts), CONTEXT)
    return [texts[i] for i in np.flatnonzero((got != expected).any(axis=1))]


def test_ids_identical_to_open_clip_over_a_generated_corpus(ours: ClipBpeTokenizer, theirs) -> None:
    texts = corpus()
    assert len(texts) > 4500
    assert differences(ours, theirs, texts) == []


@settings(max_examples=400, deadline=None)
@given(st.lists(st.text(), min_size=1, max_size=6))
def test_ids_identical_on_hypothesis_text(ours: ClipBpeTokenizer, theirs, texts: list[str]) -> None:
    assert differences(ours, theirs, texts) == []


FRAGMENT = st.sampled_from(
    [*SPECIALS, *PUNCT, *HTML, *SPACES, *WORDS, "<", ">", "_", "s", "\u017f"]
)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.lists(FRAGMENT | st.text(max_size=4), max_size=12).map("".join), min_size=1))
def test_ids_identical_around_special_tokens_and_entities(
    ours: ClipBpeTokenizer, theirs, texts: list[str]
) -> None:
    assert differences(ours, theirs, texts) == []


def test_truncation_keeps_end_of_text_last_and_pads_with_zeros(
    ours: ClipBpeTokenizer, theirs
) -> None:
    long, short = "cat " * 200, "a cat"
    rows = ours.tokenize([long, short])
    assert rows.dtype == np.int32
    assert rows[0, 0] == ours.start_id == 49406 and rows[0, -1] == ours.end_id == 49407
    assert (rows[0, 1:-1] != 0).all()  # 75 text tokens fill the row
    assert list(rows[1, :4]) == [49406, *theirs([short])[0, 1:3].tolist(), 49407]
    assert (rows[1, 4:] == 0).all()
    np.testing.assert_array_equal(rows, theirs([long, short]).numpy())


@pytest.mark.parametrize("context_length", [2, 5, 16])
def test_other_context_lengths_frame_as_open_clip_does(
    tokenizer_file: Path, context_length: int
) -> None:
    texts = ["a photo of a cat on a mat", "", "x" * 40, "<end_of_text> a"]
    got = ClipBpeTokenizer.from_file(tokenizer_file, context_length).tokenize(texts)
    expected = open_clip.tokenizer.SimpleTokenizer(context_length=context_length)(texts).numpy()
    np.testing.assert_array_equal(got, expected)


def test_empty_and_blank_texts_are_start_and_end_only(ours: ClipBpeTokenizer) -> None:
    rows = ours.tokenize(["", "   ", "\n\t", "\u3000"])
    assert (rows[:, :2] == [ours.start_id, ours.end_id]).all() and (rows[:, 2:] == 0).all()
    assert ours.tokenize([]).shape == (0, CONTEXT)


def test_literal_special_tokens_become_special_ids_only_where_open_clip_matches_them(
    ours: ClipBpeTokenizer,
) -> None:
    end = ours.end_id
    assert list(ours.tokenize(["a<end_of_text>b"])[0, :5]) == [49406, 320, end, 321, end]
    # inside a run of punctuation open_clip's regex never starts a match at "<"
    assert ours.tokenize(["!<end_of_text>"])[0].tolist().count(end) == 1  # the framing one


def test_cleaning_is_open_clips() -> None:
    assert clean("  Caf\u00c3\u00a9 &amp;amp; TEA\t\n ok ") == "café & tea ok"


def test_a_file_without_clip_specials_is_refused(tmp_path: Path) -> None:
    from tokenizers import Tokenizer as HfTokenizer
    from tokenizers import models

    path = tmp_path / "other.json"
    HfTokenizer(models.BPE(vocab={"a": 0}, merges=[])).save(str(path))
    with pytest.raises(ValueError, match="not a CLIP BPE tokenizer"):
        ClipBpeTokenizer.from_file(path, CONTEXT)
    with pytest.raises(ValueError, match="context_length"):
        ClipBpeTokenizer.from_file(path, 1)


def test_importing_the_tokenizer_never_imports_torch() -> None:
    code = "import sys, clip_gateway.text.tokenizer; print('torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"
