"""The peer systems' harness (bench/harness/systems.py, ceilings.py, peer_checkpoint.py), without
Infinity: its wire format both ways, the cells, the ceilings' arithmetic, and the tokenizer files
the peer's checkpoint is given."""

from __future__ import annotations

import base64
import gzip
import json
from pathlib import Path

import numpy as np
import orjson
import pytest

from bench.harness import ceilings, peer_checkpoint, systems
from tests import samples


def test_infinity_gets_data_uris_and_answers_base64_floats() -> None:
    images = [samples.compact(0), samples.compact(1)]
    body = orjson.loads(systems.request_body(images, "clip"))
    assert body["model"] == "clip" and body["encoding_format"] == "base64"
    for uri, data in zip(body["input"], images, strict=True):
        head, payload = uri.split(",", 1)
        assert head == "data:image/jpeg;base64" and base64.b64decode(payload) == data
    rows = np.arange(6, dtype="<f4").reshape(2, 3)
    answer = {"data": [{"embedding": base64.b64encode(r.tobytes()).decode()} for r in rows]}
    np.testing.assert_array_equal(systems.vectors(orjson.dumps(answer)), rows)


def test_every_cell_is_measured_in_order() -> None:
    names = [systems.cell_name(b, c) for b, c in systems.CELLS]
    assert names == ["b1xc1", "b1xc4", "b8xc1", "b8xc4", "b32xc1", "b32xc4"]


def test_vit_b32_operations_per_image() -> None:
    # 4.41 G multiply-adds: the figure ViT-B/32's papers give (4.4 GFLOPs as MACs)
    assert pytest.approx(8.82, abs=0.01) == ceilings.VIT_B32_GOP


def test_the_gemm_ceilings_measure_both_precisions() -> None:
    found = ceilings.gemm_ceilings(n=128, threads=1, reps=1)
    assert found["fp32_gflops"] > 0 and found["int8_gops"] > 0
    assert (found["n"], found["threads"]) == (128, 1)


@pytest.mark.torch
def test_the_peer_tokenizer_is_open_clips_vocabulary(tmp_path: Path) -> None:
    import open_clip
    from open_clip.tokenizer import SimpleTokenizer

    bpe = Path(open_clip.__file__).parent / "bpe_simple_vocab_16e6.txt.gz"
    vocab_file, merges_file = peer_checkpoint.write_tokenizer_files(bpe, tmp_path)
    vocab = json.loads(vocab_file.read_text())
    ours = SimpleTokenizer().encoder
    # open_clip names its specials <start_of_text>/<end_of_text>; Hugging Face's CLIP tokenizer
    # expects OpenAI's <|startoftext|>/<|endoftext|>: the same ids
    assert vocab.pop("<|startoftext|>") == ours.pop("<start_of_text>") == 49406
    assert vocab.pop("<|endoftext|>") == ours.pop("<end_of_text>") == 49407
    assert vocab == ours  # token for token, id for id
    merges = merges_file.read_text().splitlines()
    with gzip.open(bpe) as packed:
        assert merges[1] == packed.read().decode().split("\n")[1]
    assert len(peer_checkpoint.bytes_to_unicode()) == 256
