"""The public surface docs/CLI.md promises is what the package exports, and nothing more."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import clip_gateway.client

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "CLI.md").read_text()
TABLE = PAGE.split("\n## What is public\n", 1)[1]


def test_the_client_exports_exactly_what_the_page_lists() -> None:
    listed = set()
    for line in TABLE.splitlines():
        found = re.match(r"\| `from clip_gateway\.client import ([\w, ]+)`", line)
        if found:
            listed.update(name.strip() for name in found.group(1).split(","))
    assert listed == set(clip_gateway.client.__all__)


def test_the_commands_on_the_page_are_the_installed_scripts() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    rows = [line.split(" | ")[0] for line in TABLE.splitlines() if line.startswith("| `clip-")]
    assert {re.match(r"\| `([\w-]+)`", row).group(1) for row in rows} == set(scripts)  # type: ignore[union-attr]


def test_every_cli_command_on_the_page_exists() -> None:
    from clip_gateway.cli.main import CLIENT_COMMANDS, SERVER_COMMANDS

    row = next(line for line in TABLE.splitlines() if line.startswith("| `clip-gateway` (or"))
    named = set(re.findall(r"`(\w+)`", row.split(" | ")[1]))
    assert named == set(CLIENT_COMMANDS) | set(SERVER_COMMANDS)
