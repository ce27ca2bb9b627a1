"""The README and docs/ hold together: every relative link reaches a file, every ``#anchor`` a
heading of its page (GitHub's slugs), and every docs page is reachable from the README by links,
directly or through docs/README.md, so no page is an orphan. The Markdown is parsed by
markdown-it-py (what rich renders with), so links and headings inside code are not read."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from urllib.parse import unquote

import pytest
from markdown_it import MarkdownIt
from markdown_it.token import Token

ROOT = Path(__file__).resolve().parents[2]

#: Pages a link may name while they do not exist yet (none: every linked page is checked).
PENDING: frozenset[str] = frozenset()

PARSER = MarkdownIt("commonmark").enable("table")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # https:, mailto:, ...
HTML_LINK = re.compile(r"""\b(?:href|src)\s*=\s*["']([^"']+)["']""")


def walk(tokens: list[Token]) -> Iterator[Token]:
    for token in tokens:
        yield token
        yield from walk(token.children or [])


def slug(text: str) -> str:
    """GitHub's heading anchor (github-slugger): lower case, every character but letters,
    digits, marks, ``-``, ``_`` and spaces removed, each space a hyphen."""
    kept = (c for c in text.lower() if c in "-_ " or unicodedata.category(c)[0] in "LNM")
    return "".join(kept).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor on ``page``, repeats numbered as GitHub numbers them."""
    found: set[str] = set()
    tokens = PARSER.parse(page.read_text())
    for opening, inline in pairwise(tokens):
        if opening.type != "heading_open":
            continue
        text = "".join(
            t.content for t in walk(inline.children or []) if t.type in ("text", "code_inline")
        )
        base = candidate = slug(text)
        n = 0
        while candidate in found:
            n += 1
            candidate = f"{base}-{n}"
        found.add(candidate)
    return found


def links(page: Path) -> list[str]:
    """Every link and image target on ``page`` (Markdown and inline HTML), outside code."""
    targets = []
    for token in walk(PARSER.parse(page.read_text())):
        if token.type == "link_open":
            targets.append(str(token.attrs["href"]))
        elif token.type == "image":
            targets.append(str(token.attrs["src"]))
        elif token.type in ("html_inline", "html_block"):
            targets += HTML_LINK.findall(token.content)
    return targets


def problems(root: Path, pending: frozenset[str] = frozenset()) -> list[str]:
    """What is broken: dangling links and anchors in README.md and docs/*.md, and docs pages
    no chain of links from README.md reaches."""
    readme = root / "README.md"
    pages = [readme, *sorted((root / "docs").glob("*.md"))]
    found: list[str] = []
    edges: dict[Path, set[Path]] = {}
    for page in pages:
        edges[page] = set()
        for target in links(page):
            if SCHEME.match(target) or target.startswith("//"):
                continue
            path_part, _, fragment = target.partition("#")
            path = (page.parent / unquote(path_part)).resolve() if path_part else page
            where = f"{page.relative_to(root)}: {target}"
            if not path.exists():
                if path.relative_to(root).as_posix() not in pending:
                    found.append(f"{where}: no such file")
                continue
            if path.suffix == ".md":
                edges[page].add(path)
                if fragment and unquote(fragment) not in anchors(path):
                    found.append(f"{where}: no heading #{fragment} in {path.name}")
    reached, todo = {readme}, [readme]
    while todo:
        for nxt in edges.get(todo.pop(), set()):
            if nxt not in reached:
                reached.add(nxt)
                todo.append(nxt)
    found += [
        f"{page.relative_to(root)}: no chain of links from README.md reaches it"
        for page in pages
        if page not in reached
    ]
    return found


@pytest.mark.slow
def test_every_link_anchor_and_page_holds() -> None:
    assert problems(ROOT, PENDING) == []


def test_slugs_are_githubs() -> None:
    # anchors GitHub gives these repository's headings (links to them were written against it)
    assert slug("Core plan (CPU profiles)") == "core-plan-cpu-profiles"
    assert slug("The open_clip model family") == "the-open_clip-model-family"
    assert slug("4. OpenVINO for the CPU profiles") == "4-openvino-for-the-cpu-profiles"
    assert slug("Compose: the rolling restart (make compose-test)") == (
        "compose-the-rolling-restart-make-compose-test"
    )
    assert slug("Multi-GPU host (deploy/compose/)") == "multi-gpu-host-deploycompose"
    assert slug("Beside Infinity × 2 — ok") == "beside-infinity--2--ok"


def test_the_check_finds_each_kind_of_break(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(
        "# Top\n\n"
        "[good](docs/A.md#a-section) [twice](docs/A.md#same-1) [self](#top) [img](docs/x.png)\n"
        "[gone](docs/MISSING.md) [bad anchor](docs/A.md#nope) [site](https://example.com/x)\n"
        "[later](docs/LATER.md)\n\n"
        "```\n[in code](docs/CODE.md)\n```\n\n`[inline](docs/INLINE.md)`\n"
    )
    (tmp_path / "docs" / "x.png").write_bytes(b"")
    (tmp_path / "docs" / "A.md").write_text(
        "# A\n\n## A section\n\n## Same\n\n## Same\n\n[back](../README.md#nowhere)\n"
    )
    (tmp_path / "docs" / "ORPHAN.md").write_text("# Orphan\n\n[a](A.md)\n")
    assert problems(tmp_path, frozenset({"docs/LATER.md"})) == [
        "README.md: docs/MISSING.md: no such file",
        "README.md: docs/A.md#nope: no heading #nope in A.md",
        "docs/A.md: ../README.md#nowhere: no heading #nowhere in README.md",
        "docs/ORPHAN.md: no chain of links from README.md reaches it",
    ]
    # the pending entry excuses only its own page, and only while it is absent
    assert "README.md: docs/LATER.md: no such file" in problems(tmp_path)
    (tmp_path / "docs" / "LATER.md").write_text("# Later\n\n[x](nothing.md)\n")
    assert "docs/LATER.md: nothing.md: no such file" in problems(
        tmp_path, frozenset({"docs/LATER.md"})
    )
