"""bench/ is a harness and studies (bench/README.md): tests outside tests/bench import the harness
only (a live study's own checks are in tests/bench), the harness imports no study, no study
module is a script of its own, and the README's table has one row per subcommand of
``python -m bench``. Imports are read with ast, nothing is imported but the parser (no torch)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: What a test may import from bench: the harness, and the entry point's parser (the references
#: test reads the subcommands from it).
TESTS_MAY_IMPORT = ("bench.harness", "bench.__main__")


def bench_imports(source: str) -> Iterator[tuple[int, str]]:
    """(line, module) of every import of bench or below it, at any depth of the file;
    ``from bench import x`` is ``bench.x``."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found = [node.module]
            if node.module == "bench":
                found = [f"bench.{alias.name}" for alias in node.names]
        else:
            continue
        for module in found:
            if module == "bench" or module.startswith("bench."):
                yield node.lineno, module


def allowed(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(f"{p}.") for p in prefixes)


def imports_outside(folder: Path, prefixes: tuple[str, ...]) -> list[str]:
    """``file:line: module`` for each bench import under ``folder`` that ``prefixes`` do not
    allow."""
    return [
        f"{path.relative_to(folder.parent).as_posix()}:{line}: {module}"
        for path in sorted(folder.rglob("*.py"))
        for line, module in bench_imports(path.read_text())
        if not allowed(module, prefixes)
    ]


def test_tests_import_no_study() -> None:
    found = [
        line
        for line in imports_outside(ROOT / "tests", TESTS_MAY_IMPORT)
        if not line.startswith("tests/bench/")
    ]
    assert not found, "tests import the harness only (bench/README.md):\n" + "\n".join(found)


def test_the_harness_imports_no_study() -> None:
    found = imports_outside(ROOT / "bench" / "harness", ("bench.harness",))
    assert not found, "the harness imports no study:\n" + "\n".join(found)


def test_no_study_is_a_script_of_its_own() -> None:
    scripts = [
        path.name
        for path in sorted((ROOT / "bench" / "studies").glob("*.py"))
        if re.search(r"""^if __name__ == ["']__main__["']""", path.read_text(), re.M)
    ]
    assert not scripts, f"a study starts only as python -m bench STUDY: {scripts}"


def test_the_readme_has_a_row_per_study() -> None:
    from bench.__main__ import _parser

    subcommands = next(a for a in _parser()._actions if a.dest == "command")
    studies = set(subcommands.choices or ())
    table = (ROOT / "bench" / "README.md").read_text()
    rows = re.findall(r"^\|[^|\n]*\| `python -m bench ([a-z][\w-]*)[^`]*` \|", table, re.M)
    assert sorted(rows) == sorted(studies), "bench/README.md's table vs python -m bench"
    assert len(rows) == len(set(rows))


def test_every_study_has_the_same_main() -> None:
    """``main(argv: list[str]) -> int`` in each study module, its arguments parsed by the
    harness's one parser (``study.parser``): one way of starting and parsing a study."""
    from bench.__main__ import STUDIES

    odd = []
    for module, _ in STUDIES.values():
        tree = ast.parse((ROOT / "bench" / "studies" / f"{module}.py").read_text())
        main = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
        if (
            not main
            or (ast.unparse(main[0].args), ast.unparse(main[0].returns or tree))
            != (
                "argv: list[str]",
                "int",
            )
            or "study.parser(" not in ast.unparse(main[0])
        ):
            odd.append(module)
    assert not odd, f"a study's entry is main(argv: list[str]) -> int over study.parser: {odd}"


def test_the_readme_has_a_row_per_concluded_study() -> None:
    """A concluded study's row gives its command at the commit that holds its code."""
    from bench.__main__ import COMMIT, CONCLUDED, STUDIES

    table = (ROOT / "bench" / "README.md").read_text()
    command = rf"`git checkout {re.escape(COMMIT)} && python -m bench ([a-z][\w-]*)[^`]*`"
    at_tag = rf"^\|[^|\n]*\| {command} \|"
    rows = re.findall(at_tag, table, re.M)
    assert sorted(rows) == sorted(CONCLUDED), "bench/README.md's concluded table vs CONCLUDED"
    assert not set(CONCLUDED) & set(STUDIES)
    assert not [name for name in CONCLUDED if (ROOT / "bench/studies" / f"{name}.py").exists()]


def test_the_check_finds_each_way_of_importing_a_study(tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    (tests / "unit").mkdir(parents=True)
    (tests / "unit" / "test_a.py").write_text(
        "from bench.harness.photos import jpeg\n"
        "from bench.harness import load\n"
        "from bench.__main__ import _parser\n"
        "import bench.studies.peers\n"
        "from bench.studies import cost\n"
        "from bench import studies, harness\n"
        "def f():\n"
        "    from bench.studies.peers_report import goals\n"
        "import benchmark\n"
    )
    assert imports_outside(tests, TESTS_MAY_IMPORT) == [
        "tests/unit/test_a.py:4: bench.studies.peers",
        "tests/unit/test_a.py:5: bench.studies",
        "tests/unit/test_a.py:6: bench.studies",
        "tests/unit/test_a.py:8: bench.studies.peers_report",
    ]
