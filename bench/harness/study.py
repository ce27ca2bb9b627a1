"""What every study's ``main(argv)`` shares (``python -m bench STUDY ARGS`` calls it): its parser
(``python -m bench STUDY``, the module's docstring, ``--out`` and, for a study with a CI-sized
run, ``--smoke``), where its results go by default, and the exit status of a run whose answers
are checked."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "results"


def parser(name: str, doc: str | None, *, smoke: str | None = None) -> argparse.ArgumentParser:
    """``python -m bench NAME``'s parser: ``--out`` and, where ``smoke`` says what it does,
    ``--smoke``."""
    found = argparse.ArgumentParser(
        prog=f"python -m bench {name}",
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    found.add_argument("--out", type=Path, default=None, help="default: under bench/results/")
    if smoke:
        found.add_argument("--smoke", action="store_true", help=smoke)
    return found


def out(args: argparse.Namespace, folder: str) -> Path:
    """``--out``, else bench/results/<folder> (<folder>-smoke for a ``--smoke`` run)."""
    if args.out is not None:
        path: Path = args.out
        return path
    return RESULTS / (f"{folder}-smoke" if getattr(args, "smoke", False) else folder)


def checked(out: Path, results: dict[str, Any]) -> int:
    """Say where the results are; 1 if an answer was wrong or an unexpected 5xx came, else 0."""
    print(out, flush=True)
    return 1 if results.get("wrong") or results.get("unexpected_5xx") else 0
