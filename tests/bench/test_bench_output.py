"""bench/harness/output.py: the one writer of a bench's JSON, Markdown and PNG files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.harness.output import figure, write_results


def bars(results: dict[str, Any], path: Path) -> None:
    with figure(path, figsize=(3, 2)) as (_, ax):
        ax.bar(list(results["rates"]), list(results["rates"].values()))


def test_the_three_files_side_by_side(tmp_path: Path) -> None:
    results = {"rates": {"a": 1.5, "b": 3.0}, "command": "python -m bench x"}
    out = tmp_path / "new" / "folder"  # made when missing
    path = write_results(out, "x", results, markdown="| a | b |\n", plot=bars)
    assert path == out / "x.json"
    assert json.loads(path.read_text()) == results
    assert path.read_text() == json.dumps(results, indent=1) + "\n"
    assert (out / "x.md").read_text() == "| a | b |\n"
    assert (out / "x.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert sorted(p.name for p in out.iterdir()) == ["x.json", "x.md", "x.png"]


def test_json_alone_and_compact(tmp_path: Path) -> None:
    write_results(tmp_path, "timeline", {"points": [[0, 1], [1, 2]]}, indent=None)
    assert [p.name for p in tmp_path.iterdir()] == ["timeline.json"]
    assert (tmp_path / "timeline.json").read_text() == '{"points": [[0, 1], [1, 2]]}\n'


def test_a_figure_is_closed_even_when_drawing_fails(tmp_path: Path) -> None:
    import matplotlib.pyplot as plt

    before = len(plt.get_fignums())
    with pytest.raises(ZeroDivisionError), figure(tmp_path / "broken.png") as (_, ax):
        ax.plot([1, 2], [1 / 0, 2])
    assert len(plt.get_fignums()) == before
    assert not (tmp_path / "broken.png").exists()
