"""The CLIP BPE ``tokenizer.json`` the fixtures load, committed under tests/data/ so that the unit
and API tiers need neither torch nor open_clip (`make test-fast`).

It is the file the exporter writes (``clip_gateway.export.tokenizer.write_clip_bpe``) from
open_clip's ``bpe_simple_vocab_16e6.txt.gz``, xz-compressed; ``SOURCE`` beside it names the
open_clip release and the vocabulary's sha256 it came from. Regenerate both with
``python -m tests.tokenizer_data`` (needs the export extra); tests/unit/text/test_tokenizer.py fails
when they no longer match what the installed open_clip and exporter write.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import lzma
from pathlib import Path

DATA = Path(__file__).parent / "data"
COMPRESSED = DATA / "clip_bpe_tokenizer.json.xz"
SOURCE = DATA / "clip_bpe_tokenizer.source"


def unpack(directory: Path) -> Path:
    """The committed file, decompressed to ``directory/tokenizer.json`` (an export's name)."""
    path = directory / "tokenizer.json"
    path.write_bytes(lzma.decompress(COMPRESSED.read_bytes()))
    return path


def source_line() -> str:
    """What the installed open_clip would write into ``SOURCE``."""
    from open_clip.tokenizer import default_bpe

    vocab = Path(default_bpe())
    digest = hashlib.sha256(vocab.read_bytes()).hexdigest()
    version = importlib.metadata.version("open_clip_torch")
    return (
        f"open_clip_torch {version}, open_clip/{vocab.name} sha256 {digest}, written by "
        "clip_gateway.export.tokenizer.write_clip_bpe; regenerate: python -m tests.tokenizer_data\n"
    )


def main() -> None:
    import tempfile

    from clip_gateway.export.tokenizer import write_clip_bpe

    with tempfile.TemporaryDirectory() as work:
        written = Path(work) / "tokenizer.json"
        write_clip_bpe(written)
        raw = written.read_bytes()
    DATA.mkdir(exist_ok=True)
    COMPRESSED.write_bytes(lzma.compress(raw, preset=9 | lzma.PRESET_EXTREME))
    SOURCE.write_text(source_line())
    size = COMPRESSED.stat().st_size
    print(f"{COMPRESSED}: {size:,} bytes ({len(raw):,} uncompressed)")
    print(f"{SOURCE}: {SOURCE.read_text().strip()}")


if __name__ == "__main__":
    main()
