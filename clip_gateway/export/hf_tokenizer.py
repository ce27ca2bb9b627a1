"""Hugging Face text tokenizers (SigLIP, SigLIP2, XLM-R, NLLB...) for the gateway: find the files
open_clip's ``HFTokenizer`` loads for a model (a directory the user gives, or the hub), copy them
beside the graph, and write the ``tokenizer.json`` the gateway runs (clip_gateway/text/hf.py): the
backend tokenizer transformers builds from those files, as open_clip's call configures it.

Why the backend and not the hub's ``tokenizer.json`` as it is: transformers rewrites parts of it
at load (GemmaTokenizer's BOS/EOS template from ``tokenizer_config.json``, NLLB's language code
prefix, the pad token open_clip sets), and pads and truncates at call time. Saving what it built,
with open_clip's ``padding='max_length', truncation=True, max_length=context_length`` set on it,
leaves nothing to re-derive; the export then checks the gateway's ids against open_clip's own
``HFTokenizer`` on the same directory and refuses to serve text on any difference.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np

from clip_gateway.text.hf import HfTokenizer

#: The files ``AutoTokenizer.from_pretrained`` may read from a tokenizer directory or repo.
TOKENIZER_PATTERNS = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "config.json",
    "*.model",
    "vocab.*",
    "merges.txt",
)
#: Where the export keeps them (open_clip's HFTokenizer can be pointed at it again).
SOURCE_DIR = "hf_tokenizer"


class TokenizerFilesMissing(RuntimeError):
    """The Hugging Face tokenizer's files are neither in the given directory nor fetchable."""


def missing_message(model_name: str, hf_name: str, why: str) -> str:
    return (
        f"{model_name}'s text tower uses the Hugging Face tokenizer {hf_name!r}, whose files "
        f"(tokenizer.json, tokenizer_config.json, special_tokens_map.json) {why}. Give them "
        "either as a local directory (python -m clip_gateway.export --tokenizer DIR, or "
        "CLIP_TOKENIZER=DIR "
        f"for make serve / GATEWAY_TOKENIZER=DIR), or let the exporter download {hf_name!r} "
        "from the Hugging Face hub (network, or a hub cache with it)"
    )


def find_source(model_name: str, hf_name: str, directory: Path | None) -> tuple[Path, str]:
    """The directory to load the tokenizer from, and where it came from (``directory``/``hub``)."""
    if directory is not None:
        if (
            not (directory / "tokenizer_config.json").is_file()
            and not (directory / "tokenizer.json").is_file()
        ):
            raise TokenizerFilesMissing(
                missing_message(model_name, hf_name, f"are not in {directory}")
            )
        return directory, "directory"
    from huggingface_hub import snapshot_download

    try:
        found = snapshot_download(hf_name, allow_patterns=list(TOKENIZER_PATTERNS))
    except Exception as exc:  # offline, no such repo, no cache: all say the same to the user
        raise TokenizerFilesMissing(
            missing_message(
                model_name, hf_name, f"could not be fetched ({type(exc).__name__}: {exc})"
            )
        ) from exc
    return Path(found), "hub"


def reference(source: Path, context_length: int, options: dict[str, Any]) -> Any:
    """open_clip's own ``HFTokenizer`` on ``source``, as ``get_tokenizer`` builds it."""
    from open_clip.tokenizer import HFTokenizer

    return HFTokenizer(str(source), context_length=context_length, **options)


def write(
    source: Path, out_dir: Path, file_name: str, context_length: int, options: dict[str, Any]
) -> dict[str, Any]:
    """Copy the source files to ``out_dir/hf_tokenizer`` and write ``out_dir/file_name``; return
    what the manifest records about the framing (the gateway's ``tokenizer_options``)."""
    import tokenizers

    theirs = reference(source, context_length, options)
    hf = theirs.tokenizer
    if not getattr(hf, "is_fast", False):
        raise RuntimeError(f"{source}: transformers built a slow tokenizer ({type(hf).__name__})")
    # transformers may switch the backend per call (NLLB's __call__ resets the language-code
    # template to its src_lang, undoing open_clip's set_language under transformers 5): save it
    # as a call leaves it, which is what open_clip's ids come from
    theirs(["a photo of a cat"])
    backend = tokenizers.Tokenizer.from_str(hf.backend_tokenizer.to_str())
    # what transformers' __call__ sets before encoding (set_truncation_and_padding)
    backend.enable_truncation(
        max_length=context_length, stride=0, strategy="longest_first",
        direction=hf.truncation_side,
    )  # fmt: skip
    backend.enable_padding(
        direction=hf.padding_side, pad_id=hf.pad_token_id, pad_type_id=hf.pad_token_type_id,
        pad_token=hf.pad_token, length=context_length,
    )  # fmt: skip
    backend.save(str(out_dir / file_name))
    copied = out_dir / SOURCE_DIR
    copied.mkdir()
    for pattern in TOKENIZER_PATTERNS:
        for path in source.glob(pattern):
            shutil.copy2(path, copied / path.name)
    return {
        "clean": options.get("clean", "whitespace"),
        "strip_sep_id": hf.sep_token_id if options.get("strip_sep_token") else None,
        "pad_id": hf.pad_token_id,
        "language": options.get("language"),
        "class": type(hf).__name__,
        "source_files": sorted(p.name for p in copied.iterdir()),
    }


def check(
    path: Path, source: Path, context_length: int, options: dict[str, Any], texts: list[str]
) -> dict[str, Any]:
    """The gateway's ids from the written file vs open_clip's HFTokenizer; raises on any
    difference (never a silent approximation)."""
    theirs = reference(source, context_length, options)
    strip = theirs.tokenizer.sep_token_id if options.get("strip_sep_token") else None
    ours = HfTokenizer.from_file(
        path, context_length, clean=options.get("clean", "whitespace"), strip_sep_id=strip
    )
    # the special tokens' own strings too: each tokenizer has its own
    texts = texts + [f"a {token} b" for token in theirs.tokenizer.all_special_tokens]
    got, expected = ours.tokenize(texts), theirs(texts).numpy()
    differ = np.flatnonzero((got != expected).any(axis=1))
    if len(differ):
        first = texts[int(differ[0])]
        raise RuntimeError(
            f"the exported tokenizer disagrees with open_clip's HFTokenizer on {len(differ)} of "
            f"{len(texts)} texts, e.g. {first!r}: refusing to serve text approximately"
        )
    return {"texts": len(texts), "mismatches": 0}
