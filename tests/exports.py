"""The tests' exports, each made in a child process of its own when the export cache lacks it.

An export traces the model and checks its parity in torch: for a SigLIP2 model that peaks at
~10 GB, and a process keeps most of what it once held (the allocator's arenas). Made inside the
pytest process, the exports of a run pile up there beside the tritonservers and gateways the
tests start, and on a 24 GiB machine the kernel ends the run (CI saw ``make: *** [pytest]
Killed`` when a random order put the SigLIP exports early). A child's memory goes back when it
exits; a cache hit opens the entry here, torch never loaded."""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from clip_gateway.model.spec import (
    MANIFEST,
    ExportedModel,
    Weights,
    cache_entry,
    default_cache_dir,
    int8_code_version,
)


def ensure_exported(
    model_name: str,
    weights: Weights,
    *,
    tokenizer: Path | None = None,
    int8: bool = False,
    env: dict[str, str] | None = None,
) -> ExportedModel:
    """``clip_gateway.export.build.ensure_exported`` for the default cache, run in a spawned
    child unless the entry (and its INT8 files, when asked for) is already there. ``env``: set
    in the child before anything is imported (what a library reads at import, such as the
    Hugging Face hub's offline switch)."""
    entry = cache_entry(model_name, weights, default_cache_dir(), tokenizer=tokenizer)
    if (entry / MANIFEST).exists():
        cached = ExportedModel.open(entry)
        if not int8 or (cached.int8 or {}).get("code_version") == int8_code_version():
            return cached
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as child:
        directory = child.submit(_export, model_name, weights, tokenizer, int8, env or {}).result()
    return ExportedModel.open(Path(directory))


def _export(
    model_name: str, weights: Weights, tokenizer: Path | None, int8: bool, env: dict[str, str]
) -> str:
    os.environ.update(env)
    from clip_gateway.export.build import ensure_exported as export

    return str(export(model_name, weights, tokenizer=tokenizer, int8=int8).directory)
