"""The peer's model: a Hugging Face CLIP checkpoint at ViT-B/32's sizes with random weights, and
its processor, written to a directory Infinity loads offline (``HF_HUB_OFFLINE=1``).

``.peer-env/bin/python -m bench.harness.peer_checkpoint OUT_DIR``: runs in the peer's own virtualenv
(transformers there; the project's environment has none). Nothing is downloaded: the tokenizer's
vocabulary and merges are open_clip's CLIP BPE file (the same as OpenAI's), passed by path, and
the image processor is OpenAI CLIP's configuration written out by hand.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

#: OpenAI CLIP's normalisation (what open_clip's ViT-B-32 uses too).
MEAN = [0.48145466, 0.4578275, 0.40821073]
STD = [0.26862954, 0.26130258, 0.27577711]


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte → printable character map, as CLIP's tokenizer uses it."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]  # fmt: skip
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars), strict=True))


def write_tokenizer_files(bpe_gz: Path, out: Path) -> tuple[Path, Path]:
    """vocab.json + merges.txt from open_clip's ``bpe_simple_vocab_16e6.txt.gz`` (its
    SimpleTokenizer's vocabulary: bytes, bytes + ``</w>``, the merges, the two specials)."""
    with gzip.open(bpe_gz) as packed:
        lines = packed.read().decode("utf-8").split("\n")
    merges = [tuple(line.split()) for line in lines[1 : 49152 - 256 - 2 + 1]]
    vocab = list(bytes_to_unicode().values())
    vocab += [v + "</w>" for v in vocab] + ["".join(m) for m in merges]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    vocab_file, merges_file = out / "vocab.json", out / "merges.txt"
    vocab_file.write_text(json.dumps({token: i for i, token in enumerate(vocab)}))
    merges_file.write_text("#version: 0.2\n" + "\n".join(" ".join(m) for m in merges) + "\n")
    return vocab_file, merges_file


def main(out: Path, bpe_gz: Path, seed: int = 0) -> None:
    import torch
    from transformers import (
        CLIPConfig,
        CLIPImageProcessor,
        CLIPModel,
        CLIPProcessor,
        CLIPTextConfig,
        CLIPTokenizerFast,
        CLIPVisionConfig,
    )

    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    # ViT-B/32: 12 x 768 vision (patch 32, 224 px), 12 x 512 text, 512-d projection
    config = CLIPConfig(
        text_config=CLIPTextConfig(hidden_size=512, intermediate_size=2048, num_attention_heads=8,
                                   num_hidden_layers=12, max_position_embeddings=77).to_dict(),
        vision_config=CLIPVisionConfig(hidden_size=768, intermediate_size=3072,
                                       num_attention_heads=12, num_hidden_layers=12,
                                       image_size=224, patch_size=32).to_dict(),
        projection_dim=512,
    )  # fmt: skip
    CLIPModel(config).eval().save_pretrained(out)
    vocab, merges = write_tokenizer_files(bpe_gz, out)
    tokenizer = CLIPTokenizerFast(vocab_file=str(vocab), merges_file=str(merges))
    crop = {"height": 224, "width": 224}
    images = CLIPImageProcessor(size={"shortest_edge": 224}, crop_size=crop, image_mean=MEAN,
                                image_std=STD, resample=3)  # fmt: skip
    CLIPProcessor(image_processor=images, tokenizer=tokenizer).save_pretrained(out)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
