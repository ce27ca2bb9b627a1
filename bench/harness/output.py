"""The one writer of a bench's results, side by side in its output folder: ``NAME.json`` (the
figures: what the table and the plot are made from), ``NAME.md`` (the table the docs quote) and
``NAME.png`` (the plot, drawn headless).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

Plot = Callable[[dict[str, Any], Path], None]


def write_results(
    out: Path,
    name: str,
    results: dict[str, Any],
    *,
    markdown: str | None = None,
    plot: Plot | None = None,
    indent: int | None = 1,
) -> Path:
    """``out/NAME.json`` from ``results``; ``out/NAME.md`` from ``markdown`` and ``out/NAME.png``
    by ``plot(results, path)`` where given; ``indent=None`` for a compact JSON file (a long
    timeline). The JSON file's path."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(results, indent=indent) + "\n")
    if markdown is not None:
        (out / f"{name}.md").write_text(markdown)
    if plot is not None:
        plot(results, out / f"{name}.png")
    return path


@contextlib.contextmanager
def figure(path: Path, *, dpi: int = 110, **layout: Any) -> Iterator[tuple[Any, Any]]:
    """``(fig, axes)`` of ``plt.subplots(**layout)`` on the headless backend, laid out and saved to
    ``path`` when the block ends, closed either way."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(**layout)
    try:
        yield fig, axes
        fig.tight_layout()
        fig.savefig(path, dpi=dpi)
    finally:
        plt.close(fig)
