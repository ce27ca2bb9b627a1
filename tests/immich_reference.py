"""What Immich's own machine-learning server computes, written from its sources, never from the
code under test: the reference the gateway's ``/predict`` must match (docs/IMMICH.md).

Read from immich-app/immich, ``machine-learning/immich_ml/`` (``models/transforms.py`` at
52605e8, ``models/clip/visual.py`` at 8ed3884, ``models/clip/textual.py`` at 1b5006c):

- images: ``decode_pil`` (Pillow opens the bytes, loads the first frame, converts to RGB; no
  EXIF orientation), ``resize_pil`` (the short side to the model's size, the other
  ``int(ratio * size)``, Pillow bicubic, whatever the model's interpolation or resize mode),
  ``crop_pil`` (a centred square at ``int(side / 2 - size / 2)``), ``to_numpy`` (/255 as
  float32), ``normalize`` ((x - mean) / std with the model's mean and std), CHW; the ONNX
  model's output unchanged (Immich exports it L2-normalised);
- texts: ``clean_text`` (whitespace runs to one space, trimmed; with the model's
  ``tokenizer_kwargs.clean == "canonicalize"``, as SigLIP's: ``string.punctuation`` removed and
  lower case, in that order), then ``tokenizers.Tokenizer.from_file(tokenizer.json)`` with
  padding to the context length with the ``tokenizer_config.json`` pad token, truncation to it,
  and ``encode`` with the file's own normaliser and post-processor.

Immich downloads ``tokenizer.json`` from the Hugging Face hub, which tests cannot reach. For
OpenAI's CLIP it is Hugging Face's ``CLIPTokenizerFast`` of open_clip's BPE vocabulary and
merges; ``clip_tokenizer_json`` builds that file with ``tokenizers``, part for part. The model
is open_clip's with random weights (tests/reference.py), so only preprocessing differs between
this side and the gateway's.
"""

from __future__ import annotations

import gzip
import io
import string
from functools import cache
from pathlib import Path
from typing import Literal

import numpy as np
from PIL import Image, ImageOps

_PUNCTUATION = str.maketrans("", "", string.punctuation)


def decode_pil(data: bytes | Image.Image) -> Image.Image:
    image = data if isinstance(data, Image.Image) else Image.open(io.BytesIO(data))
    image.load()
    return image if image.mode == "RGB" else image.convert("RGB")


def resize_pil(image: Image.Image, size: int) -> Image.Image:
    if image.width < image.height:
        return image.resize(
            (size, int((image.height / image.width) * size)), resample=Image.Resampling.BICUBIC
        )
    return image.resize(
        (int((image.width / image.height) * size), size), resample=Image.Resampling.BICUBIC
    )


def crop_pil(image: Image.Image, size: int) -> Image.Image:
    left = int((image.size[0] / 2) - (size / 2))
    upper = int((image.size[1] / 2) - (size / 2))
    return image.crop((left, upper, left + size, upper + size))


#: Negative controls: bugs a server could have, applied to this side (cos(g, r_bug) equals
#: cos(g_bug, r) when g tracks r); the parity limits must reject each.
Perturbation = Literal["none", "channel-swap", "exif-applied", "dct-scaled", "open-clip"]


def pixels(data: bytes, size: int, perturb: Perturbation = "none") -> np.ndarray:
    """uint8 HWC pixels Immich's transform feeds the model, before /255 and mean/std."""
    if perturb == "dct-scaled":  # libjpeg's scaled IDCT down to the resize's size, then on
        image = Image.open(io.BytesIO(data))
        short = min(image.size)
        image.draft("RGB", (image.width * size // short, image.height * size // short))
        image = decode_pil(image)
    else:
        image = decode_pil(data)
    if perturb == "exif-applied":  # what open_clip users do, and Immich does not
        image = ImageOps.exif_transpose(image)
    out = np.asarray(crop_pil(resize_pil(image, size), size))
    return out[..., ::-1] if perturb == "channel-swap" else out


def embed_image(data: bytes, name: str = "ViT-B-32", perturb: Perturbation = "none") -> np.ndarray:
    """Unit-length float64 embedding of a preview, Immich's way (``open-clip``: open_clip's own
    pipeline for the model instead, tests/reference.py)."""
    # torch and open_clip only here and in embed_texts: the pixels alone serve the fast tier
    import torch

    from tests import reference

    if perturb == "open-clip":
        return reference.embed_image(data, name=name)
    clip, transform = reference.model(name)
    mean, std = reference._normalize(transform)
    size = clip.visual.image_size
    size = size[0] if isinstance(size, tuple | list) else size
    x = np.asarray(pixels(data, size, perturb), dtype=np.float32) / 255.0
    x = (x - np.array(mean, dtype=np.float32)) / np.array(std, dtype=np.float32)
    with torch.no_grad():
        out = clip.encode_image(torch.from_numpy(x.transpose(2, 0, 1)[None].copy()))
    return reference.unit(out.numpy()[0])


def embed_images(
    images: list[bytes], name: str = "ViT-B-32", perturb: Perturbation = "none"
) -> np.ndarray:
    return np.stack([embed_image(data, name, perturb) for data in images])


def clean_text(text: str, canonicalize: bool = False) -> str:
    text = " ".join(text.split())
    if canonicalize:
        text = text.translate(_PUNCTUATION).lower()
    return text


def tokenize(
    texts: list[str],
    tokenizer_json: Path,
    pad_token: str,
    context_length: int,
    canonicalize: bool = False,
) -> np.ndarray:
    """Immich's ``OpenClipTextualEncoder.tokenize``, one text at a time: int64 ``[n, ctx]``."""
    import tokenizers

    tokenizer = tokenizers.Tokenizer.from_file(str(tokenizer_json))
    pad_id = tokenizer.token_to_id(pad_token)
    tokenizer.enable_padding(length=context_length, pad_token=pad_token, pad_id=pad_id)
    tokenizer.enable_truncation(max_length=context_length)
    rows = [tokenizer.encode(clean_text(text, canonicalize)).ids for text in texts]
    return np.array(rows, dtype=np.int64)


def embed_texts(ids: np.ndarray, name: str = "ViT-B-32") -> np.ndarray:
    from tests import reference

    return reference.unit(reference.embed_tokens(ids, name))


@cache
def clip_tokenizer_json(directory: Path) -> Path:
    """OpenAI CLIP's ``tokenizer.json`` as the Hugging Face hub serves it (what Immich loads for
    ``ViT-B-32__openai``), on the vocabulary and merges of open_clip's BPE file (the same
    vocabulary): the hub file's normaliser (NFC, whitespace runs to one space, lower case), its
    pre-tokeniser (the CLIP regex, then byte-level), BPE with ``</w>`` word ends, its
    ``RobertaProcessing`` frame and its two added special tokens, built with ``tokenizers``."""
    import open_clip
    from open_clip.tokenizer import default_bpe
    from tokenizers import AddedToken, Regex, Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE

    encoder = open_clip.tokenizer.SimpleTokenizer().encoder
    vocab = {token: i for token, i in encoder.items()
             if token not in ("<start_of_text>", "<end_of_text>")}  # fmt: skip
    with gzip.open(default_bpe()) as file:
        lines = file.read().decode("utf-8").split("\n")[1 : 49152 - 256 - 2 + 1]
    merges = [tuple(line.split()) for line in lines]
    tokenizer = Tokenizer(
        BPE(
            vocab,
            merges,
            unk_token="<|endoftext|>",
            continuing_subword_prefix="",
            end_of_word_suffix="</w>",
            fuse_unk=False,
        )
    )
    tokenizer.add_special_tokens([AddedToken("<|startoftext|>", normalized=False),
                                  AddedToken("<|endoftext|>", normalized=False)])  # fmt: skip
    assert tokenizer.token_to_id("<|startoftext|>") == 49406
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Lowercase()]
    )
    pattern = (r"<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]"
               r"|[^\s\p{L}\p{N}]+")  # fmt: skip
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="removed", invert=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    tokenizer.post_processor = processors.RobertaProcessing(
        ("<|endoftext|>", 49407), ("<|startoftext|>", 49406), trim_offsets=False,
        add_prefix_space=False,
    )  # fmt: skip
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / "tokenizer.json"
    tokenizer.save(str(out))
    return out
