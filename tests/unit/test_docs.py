"""The docs document every setting the code reads, as the code has it (no silent drift):
docs/SETTINGS.md's tables hold one row per setting with its default, every ``GATEWAY_*`` name the
docs and deploy files use is a setting, and the README states the two commands a newcomer
runs."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from markdown_it import MarkdownIt

from clip_gateway.cli.options import show
from clip_gateway.config.settings import (
    RENAMED_ENV,
    LaunchSettings,
    RepositorySettings,
    ServerSettings,
)

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
SETTINGS = (ROOT / "docs" / "SETTINGS.md").read_text()

#: Every setting's environment variable -> its default as an environment variable spells it.
DEFAULTS = {
    str(model.model_config.get("env_prefix", "")) + name.upper(): show(info.default)
    for model in (ServerSettings, RepositorySettings, LaunchSettings)
    for name, info in model.model_fields.items()
}
#: A ``GATEWAY_`` name, not the tail of another (``CLIP_GATEWAY_URL`` is the client's).
NAME = re.compile(r"(?<![A-Za-z0-9_])GATEWAY_[A-Z0-9_]+")
CODE = re.compile(r"`([^`]+)`")


def rows(markdown: str) -> Iterator[list[str]]:
    """The body rows of every table on a page, each a list of its cells' Markdown."""
    row: list[str] | None = None
    in_body = in_cell = False
    for token in MarkdownIt("commonmark").enable("table").parse(markdown):
        if token.type in ("tbody_open", "tbody_close"):
            in_body = token.type == "tbody_open"
        elif in_body and token.type == "tr_open":
            row = []
        elif in_body and token.type == "tr_close" and row is not None:
            yield row
        elif token.type in ("td_open", "td_close"):
            in_cell = token.type == "td_open"
        elif in_body and in_cell and token.type == "inline" and row is not None:
            row.append(token.content)


def documented(markdown: str) -> dict[str, str]:
    """Each variable a table row names in its first cell -> that variable's part of the row's
    default cell (``a`` / ``b`` for two variables, or one default for all); a variable named in
    two rows raises."""
    found: dict[str, str] = {}
    for cells in rows(markdown):
        names = NAME.findall(cells[0])
        parts = cells[1].split(" / ") if len(cells) > 1 else []
        for i, name in enumerate(names):
            assert name not in found, f"{name} has two rows"
            found[name] = parts[i] if len(parts) == len(names) else " / ".join(parts)
    return found


def same_default(cell: str, default: str) -> bool:
    """A default cell states ``default`` when its first code span spells the same value (a
    number as a number, a list as JSON); an unset or empty default may be worded (the launcher
    or the image sets it, a path derived at start)."""
    if default in ("unset", "none"):
        return True
    spans = CODE.findall(cell)
    if not spans:
        return False
    try:
        return bool(json.loads(spans[0]) == json.loads(default))
    except ValueError:
        return spans[0] == default


def test_each_setting_is_one_row_of_the_settings_tables() -> None:
    rows_named = documented(SETTINGS)
    assert sorted(set(DEFAULTS) - set(rows_named)) == [], "settings without a row"
    assert sorted(set(rows_named) - set(DEFAULTS)) == [], "rows naming no setting"


def test_each_documented_default_is_the_settings_default() -> None:
    wrong = {
        name: (cell, DEFAULTS[name])
        for name, cell in documented(SETTINGS).items()
        if name in DEFAULTS and not same_default(cell, DEFAULTS[name])
    }
    assert wrong == {}, "docs/SETTINGS.md's default vs config/settings.py's"


def pages() -> list[Path]:
    """The prose and deploy files that name settings."""
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    extra = [ROOT / "triton/README.md", ROOT / "bench/README.md", ROOT / "Dockerfile"]
    deploy = [p for p in sorted((ROOT / "deploy").rglob("*")) if p.is_file()]
    return [*docs, *extra, *deploy]


def test_every_gateway_name_the_docs_use_is_a_setting() -> None:
    known = set(DEFAULTS) | set(RENAMED_ENV)
    unknown: Counter[str] = Counter()
    for page in pages():
        for name in NAME.findall(page.read_text(errors="replace")):
            prefix = name.endswith("_")  # GATEWAY_TRITON_: a section's prefix
            if not (any(k.startswith(name) for k in known) if prefix else name in known):
                unknown[f"{page.relative_to(ROOT)}: {name}"] += 1
    assert unknown == Counter()


def test_the_checks_catch_a_missing_row_a_stale_default_and_an_unknown_name() -> None:
    page = (
        "| variable | default | meaning |\n| --- | --- | --- |\n"
        "| `GATEWAY_PORT` / `GATEWAY_HOST` | `8000` / `0.0.0.0` | where |\n"
        "| `GATEWAY_WORKERS` | `1` (the launcher: planned) | workers |\n"
        "| `GATEWAY_REQUEST_TIMEOUT_S` | `30` | deadline |\n"
        "| `GATEWAY_NO_SUCH_KNOB` | `1` | nothing |\n"
    )
    found = documented(page)
    assert list(found) == ["GATEWAY_PORT", "GATEWAY_HOST", "GATEWAY_WORKERS",
                           "GATEWAY_REQUEST_TIMEOUT_S", "GATEWAY_NO_SUCH_KNOB"]  # fmt: skip
    assert same_default(found["GATEWAY_PORT"], "8000")
    assert same_default(found["GATEWAY_REQUEST_TIMEOUT_S"], "30.0")  # a number as a number
    assert not same_default(found["GATEWAY_HOST"], DEFAULTS["GATEWAY_HOST"])  # 0.0.0.0: stale
    assert same_default("`[4,8,16,32]`", "[4, 8, 16, 32]")
    assert same_default("set by the launcher", "unset")
    assert "GATEWAY_NO_SUCH_KNOB" not in DEFAULTS
    assert NAME.findall("CLIP_GATEWAY_URL, `GATEWAY_TRITON_` and GATEWAY_X.") == [
        "GATEWAY_TRITON_",
        "GATEWAY_X",
    ]


def test_readme_states_the_two_commands() -> None:
    assert "make serve" in README
    assert "make test" in README
