"""docs/ARCHITECTURE.md's layer stack and its "never imports" column are the import contracts in
pyproject.toml ([tool.importlinter], which `lint-imports` enforces in `make lint`): the page
cannot claim a rule nothing checks, nor leave one out."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
CONTRACTS: list[dict[str, Any]] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"][
    "importlinter"
]["contracts"]
#: The root package: names in the page drop it (`http` for ``clip_gateway.http``).
SERVER = "clip_gateway"


def contract(id_: str) -> dict[str, Any]:
    return next(c for c in CONTRACTS if c["id"] == id_)


def split_layer(layer: str) -> tuple[list[str], bool]:
    """import-linter's syntax: ``a | b`` independent siblings, ``a : b`` siblings that may import
    each other, else one module."""
    for separator, independent in (("|", True), (":", False)):
        if separator in layer:
            return [m.strip() for m in layer.split(separator)], independent
    return [layer.strip()], True


STACK = [split_layer(layer) for layer in contract("stack")["layers"]]


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def table(heading: str) -> list[list[str]]:
    """The rows of the first Markdown table under ``heading`` (cells stripped, header dropped)."""
    section = PAGE.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines[2:]]


def names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def forbidden(module: str) -> set[str]:
    """What the contracts forbid ``module`` (a package or module) to import."""
    found: set[str] = set()
    for rule in CONTRACTS:
        if rule["type"] == "layers":
            layers = [split_layer(layer) for layer in rule["layers"]]
            for index, (modules, independent) in enumerate(layers):
                mine = [m for m in modules if within(module, m)]
                if not mine:
                    continue
                found.update(m for higher, _ in layers[:index] for m in higher)  # every layer above
                if independent:
                    found.update(m for m in modules if m not in mine)
        elif rule["type"] == "forbidden" and any(within(module, s) for s in rule["source_modules"]):
            found.update(rule["forbidden_modules"])
        elif rule["type"] == "independence":
            mine = [m for m in rule["modules"] if within(module, m)]
            if mine:
                found.update(m for m in rule["modules"] if m not in mine)
    return found


SERVING = contract("serving")


def serving(module: str) -> bool:
    return any(within(module, source) for source in SERVING["source_modules"])


def shown(found: set[str], stacked: bool = True) -> str:
    """The column's wording of a forbidden set: "the layers above" when it holds every layer
    above some point (two or more), else a layer whose modules may import each other by its name
    in the Layers table; then each other module (in stack order; a gateway package by its name in
    clip_gateway/) and package (export, external packages) by name."""
    parts, left = [], set(found)
    for index in range(len(STACK) - 1 if stacked else 1, 1, -1):  # off the stack: names only
        above = {m for modules, _ in STACK[:index] for m in modules}
        if above <= left:
            parts.append("the layers above")
            left -= above
            break
    for row, (modules, independent) in zip(table("Layers"), STACK, strict=True):
        if len(modules) > 1 and not independent and set(modules) <= left:
            parts.append(f"the {row[0]}")
            left -= set(modules)
    order = [m for modules, _ in STACK for m in modules]

    def key(module: str) -> tuple[int, bool, str]:
        rank = order.index(module) if module in order else len(order)
        return rank, not within(module, SERVER), module

    parts += [f"`{m.removeprefix(SERVER + '.')}`" for m in sorted(left, key=key)]
    return ", ".join(parts) or "—"


def test_the_layers_table_is_the_stack_contract() -> None:
    rows = table("Layers")
    assert [names(row[1]) for row in rows] == [modules for modules, _ in STACK]
    for row, (modules, independent) in zip(rows, STACK, strict=True):
        if len(modules) > 1:
            assert row[2] == ("no" if independent else "yes"), row


def test_every_stack_module_exists_and_every_package_is_placed() -> None:
    placed = {m for c in CONTRACTS if c["type"] == "layers" for layer in c["layers"]
              for m in split_layer(layer)[0]}  # fmt: skip
    for module in placed:
        path = ROOT / module.replace(".", "/")
        assert path.is_dir() or path.with_suffix(".py").is_file(), module
    children = {
        f"{SERVER}.{p.stem}"
        for p in (ROOT / SERVER).iterdir()
        if (p.is_dir() and (p / "__init__.py").is_file())
        or (p.suffix == ".py" and p.stem[0] != "_")
    }
    assert children - placed == {f"{SERVER}.export"}, children - placed  # the exporter: its own


@pytest.mark.parametrize("row", table("Where each concern lives"), ids=lambda row: row[0])
def test_the_never_imports_column_is_what_the_contracts_forbid(row: list[str]) -> None:
    folder = row[0].strip("`").rstrip("/").removesuffix(".py")
    module = folder.replace("/", ".")
    if (ROOT / folder / "__init__.py").is_file() or (ROOT / f"{folder}.py").is_file():
        said_once = set(SERVING["forbidden_modules"]) if serving(module) else set()
        stacked = any(within(module, m) for modules, _ in STACK for m in modules)
        expected = shown(forbidden(module) - said_once, stacked)
    else:
        assert (ROOT / folder).is_dir(), row[0]
        expected = "—"  # not a Python package (triton/): no contract
    assert row[2] == expected, f"{row[0]}: the contracts say {expected!r}"


def test_what_all_of_the_server_never_imports_is_stated_once() -> None:
    sentence = PAGE.split("\n## Where each concern lives\n", 1)[1].split("\n|", 1)[0]
    said = [name for name in names(sentence) if name != SERVER]  # "One package, `clip_gateway`"
    assert sorted(said) == sorted(SERVING["forbidden_modules"])
