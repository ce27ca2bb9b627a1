"""bench/ stays light (issue 45, bench/README.md): its non-test Python is at most a fifth of the
project's (bench/ + clip_gateway/), and it imports of the gateway only the modules bench/README.md
lists, each with its reason. lint-imports enforces the list (pyproject.toml's ``bench``
contract); here the imports are read again with ast, and the README's list, the contract's and
what bench imports are held to be one list."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The most of bench/ + clip_gateway/'s non-test Python that bench/ may be.
SHARE = 0.20


def python_lines(folder: Path) -> int:
    """Lines of the non-test Python under ``folder`` (``test_*.py`` left out)."""
    return sum(
        len(path.read_text().splitlines())
        for path in folder.rglob("*.py")
        if not path.name.startswith("test_")
    )


def gateway_imports(folder: Path) -> dict[str, set[str]]:
    """Each clip_gateway module imported under ``folder`` (at any depth of a file; ``from
    clip_gateway.a import b`` is ``clip_gateway.a.b`` where b is a module) -> where."""
    found: dict[str, set[str]] = {}
    for path in sorted(folder.rglob("*.py")):
        where = path.relative_to(folder.parent).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [_module(node.module, alias.name) for alias in node.names]
            else:
                continue
            for name in names:
                if name.split(".")[0] == "clip_gateway":
                    found.setdefault(name, set()).add(f"{where}:{node.lineno}")
    return found


def _module(package: str, name: str) -> str:
    candidate = ROOT.joinpath(*f"{package}.{name}".split("."))
    is_module = candidate.with_suffix(".py").exists() or (candidate / "__init__.py").exists()
    return f"{package}.{name}" if is_module else package


def readme_list() -> set[str]:
    text = (ROOT / "bench" / "README.md").read_text()
    heading = "\n## What the bench imports of the gateway\n"
    assert heading in text, "bench/README.md lists no imports of the gateway"
    section = text.split(heading, 1)[1].split("\n## ")[0]
    return set(re.findall(r"`(clip_gateway(?:\.\w+)+)`", section))


def contract_list() -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    contract = next(c for c in config["contracts"] if c["id"] == "bench")
    assert "bench" in config["root_packages"]
    assert contract["source_modules"] == ["bench"]
    assert contract["forbidden_modules"] == ["clip_gateway"]
    return {rule.split(" -> ")[1] for rule in contract["ignore_imports"]}


def test_bench_is_at_most_a_fifth_of_the_python() -> None:
    bench, gateway = python_lines(ROOT / "bench"), python_lines(ROOT / "clip_gateway")
    share = bench / (bench + gateway)
    assert share <= SHARE, (
        f"bench/ has {bench} lines of non-test Python, {share:.1%} of bench/ + clip_gateway/ "
        f"({gateway}): at most {SHARE:.0%}; concluded studies leave the tree (bench/README.md)"
    )


def test_bench_imports_of_the_gateway_only_what_the_readme_lists() -> None:
    listed = readme_list()
    outside = {m: sorted(w) for m, w in gateway_imports(ROOT / "bench").items() if m not in listed}
    assert not outside, f"not in bench/README.md's list: {outside}"
    assert listed == contract_list(), "bench/README.md's list vs pyproject.toml's bench contract"


def test_the_counts_and_the_imports_are_read_right(tmp_path: Path) -> None:
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "a.py").write_text(
        "import os\nimport clip_gateway.http.app\nfrom clip_gateway.imaging import jpeg\n"
        "def f():\n    from clip_gateway.errors import InvalidInput\n"
    )
    (tmp_path / "bench" / "test_a.py").write_text("x = 1\n" * 50)
    assert python_lines(tmp_path / "bench") == 5
    assert gateway_imports(tmp_path / "bench") == {
        "clip_gateway.http.app": {"bench/a.py:2"},
        "clip_gateway.imaging.jpeg": {"bench/a.py:3"},
        "clip_gateway.errors": {"bench/a.py:5"},
    }
