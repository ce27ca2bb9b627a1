"""Every repository path and command the prose names exists: in README.md, docs/*.md,
triton/README.md and bench/README.md, and in the docstrings, comments and prose strings of
clip_gateway/ and bench/.

What is read as a reference, and what it must resolve to:

- a **path** that starts at a top-level folder of the repository (``TOP``: ``clip_gateway/``,
  ``docs/``, ``bench/``, ...), or at a subpackage of ``clip_gateway`` and ends in ``.py`` or
  ``/`` (``launcher/served_export.py``, ``http/``): that file or folder; ``a.{json,md}`` is each, a
  ``*`` must match something. A bare file name (``serve.py``) is not read: its folder is the
  context's;
- ``python -m MODULE`` for a module of this repository: its file or its package's
  ``__main__.py`` (found by path, nothing imported); ``python -m bench STUDY``: a subcommand of
  bench's parser;
- ``clip-gateway COMMAND``: a command of the CLI's root; ``make TARGET``: a Makefile target.
  Both only as code (a Markdown code span or block, a docstring's or comment's code span) and
  where a shell would run them (``_AT_COMMAND``);
- a section cited by its title (``docs/PROFILES.md "The cpu-int8 profile"``, ``README
  "Tests"``): a heading of that page, or the bold words that open one of its paragraphs, which
  the title equals or begins;
- a page's path upward (``../shared/NOTES.md``) stays inside the repository.

A string literal without a space is data, not prose, and is not read (bench/harness/profiling.py
matches frames by path prefixes such as ``clip_gateway/backend/shm``).

Named on purpose though absent, each by one rule (``path_problem``): a placeholder part
(``<suite>``, ``...``, ``$VAR``) ends the path, and the folders before it must exist; a path
under an entry ``.gitignore`` anchors at the root (``/bench/results/tmp/``,
``/deploy/compose/secrets/``) is one a run or the operator writes. Paths outside the repository
(``~/Pictures``, ``/proc/cpuinfo``, ``/opt/tritonserver``, a URL's path) do not start at a
top-level folder, so they are not read. Needs neither torch nor Triton: the CLI's root and
bench's parser are imported, nothing of the server.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[2]

#: The folders a repository path starts with (``test_top_is_every_top_level_folder``).
TOP = ("clip_gateway", "bench", "docs", "tests", "triton", "deploy", "requirements", ".ci")
#: The modules ``python -m`` may name that are this repository's.
OWN_MODULES = ("clip_gateway", "bench", "tests")

PARSER = MarkdownIt("commonmark").enable("table")
#: Not read when the match would continue a path, a URL, a word or a flag (``/opt/x/docs/``).
_BEFORE = r"(?<![\w./~$@:-])"


def path_pattern(subpackages: tuple[str, ...]) -> re.Pattern[str]:
    """A path from a top-level folder, or one from a subpackage that ends in ``.py`` or ``/``."""
    top = "|".join(re.escape(t) for t in TOP)
    package = "|".join(subpackages)
    return re.compile(
        rf"{_BEFORE}(?:(?:{top})/[\w.\-/{{}},*<>$]*"
        rf"|(?:{package})/(?:[\w-]+/)*(?:[\w-]+\.py\b|(?=[\s`'\"),;:]|$)))"
    )


def subpackages(root: Path) -> tuple[str, ...]:
    return tuple(
        sorted(p.name for p in (root / "clip_gateway").iterdir() if (p / "__init__.py").exists())
    )


#: A section cited by its title: ``docs/PROFILES.md "The cpu-int8 profile"``, ``README "Tests"``.
SECTION = re.compile(
    r"(?<![\w/.-])((?:docs/|triton/)?[\w-]+\.md|README)(?:\'s)?(?:[ \t]+|[ \t]*\n[ \t]*)"
    r'"([^"]{2,80})"'
)
#: A page's path upward (``../shared/x.md``): it must stay inside the repository.
UPWARD = re.compile(rf"{_BEFORE}(?:\.\./)+[\w.\-/]*[\w/]")
PYTHON_M = re.compile(r"(?<![\w-])python3?(?:\.\d+)? -m ([\w.]+)(?:[ \t]+([a-z][\w-]*))?")
#: A command run at a commit (a concluded study: ``git checkout COMMIT && python -m bench STUDY``).
AT_TAG = re.compile(r"git checkout ([\w.-]+) && (?:\S*/)?$")
#: Where a shell would run a command: at a line's start or after a separator (``;``, ``&&``,
#: ``|``, ``(``, ``$``, a comment's ``#``, ``: ``), past VAR=value assignments and a folder
#: (``.venv/bin/``); not an argument (``kubectl -n clip-gateway create``, ``-v
#: cache:/var/cache/clip-gateway clip-gateway:0.1.0``) nor a word of printed text (``run make
#: again``).
_AT_COMMAND = r"(?m)(?:^|[;&|(#$]|:(?=[ \t]))[ \t]*(?:[A-Z_][A-Z0-9_]*=\S*[ \t]+)*"
CLI = re.compile(rf"{_AT_COMMAND}(?:\S*/)?clip-gateway(?![\w\[-])[ \t]+([a-z][\w-]*)")
MAKE = re.compile(rf"{_AT_COMMAND}make[ \t]+(?:-\S+[ \t]+)*([a-z][\w.-]*)(?![\w=-])")
CODE_SPAN = re.compile(r"``(.+?)``|`([^`\n]+)`", re.S)
#: A part of a path that stands for a name: ``<suite>``, ``...``, ``$VAR`` / ``${VAR}``.
PLACEHOLDER = re.compile(r"<[^>]*>|\.\.\.|\$")


@dataclass(frozen=True)
class Named:
    where: str  # file:line
    kind: str  # path, outside, section, module, command, target
    value: str
    detail: str = ""  # python -m bench STUDY: the study; a cited section: its title


@dataclass(frozen=True)
class Known:
    """What a command may name: the CLI's commands, bench's studies, the Makefile's targets."""

    commands: frozenset[str]
    studies: frozenset[str]
    targets: frozenset[str]
    tag: str = ""  # the commit that holds the concluded studies (bench/__main__.py COMMIT)
    concluded: frozenset[str] = frozenset()


# --- where references are read -----------------------------------------------------------------


def markdown_pages(root: Path) -> list[Path]:
    pages = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    return [*pages, root / "triton/README.md", root / "bench/README.md"]


def python_files(root: Path) -> list[Path]:
    return sorted(p for top in ("clip_gateway", "bench") for p in (root / top).rglob("*.py"))


def markdown_code(text: str) -> Iterator[tuple[int, str]]:
    """(line, text) of every code span and code block of a Markdown page."""
    for token in PARSER.parse(text):
        line = (token.map or [0])[0] + 1
        if token.type == "fence":
            yield line + 1, token.content  # the opening ``` line is the token's first
        elif token.type == "code_block":
            yield line, token.content
        for child in token.children or []:
            if child.type == "code_inline":
                yield line, child.content


def python_prose(text: str) -> Iterator[tuple[int, str]]:
    """(line, text) of every prose string (docstrings, messages) and comment of a Python file;
    comments on consecutive lines are one text (a citation may wrap), their ``#`` removed."""
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and " " in node.value:
            yield node.lineno, node.value
    block: list[str] = []
    first = last = 0
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type != tokenize.COMMENT:
            continue
        if block and token.start[0] != last + 1:
            yield first, "\n".join(block)
            block = []
        if not block:
            first = token.start[0]
        block.append(re.sub(r"^#:?", "", token.string))
        last = token.start[0]
    if block:
        yield first, "\n".join(block)


def code_spans(text: str) -> Iterator[tuple[int, str]]:
    """(line offset, text) of the ``code`` and `code` spans of a docstring or comment."""
    for match in CODE_SPAN.finditer(text):
        yield text.count("\n", 0, match.start()), match.group(1) or match.group(2)


def _read(where: str, line: int, text: str, paths: re.Pattern[str]) -> Iterator[Named]:
    """The paths and ``python -m`` modules anywhere in ``text``."""
    for match in paths.finditer(text):
        at = f"{where}:{line + text.count(chr(10), 0, match.start())}"
        yield Named(at, "path", match.group().rstrip(".,:;"))
    for match in PYTHON_M.finditer(text):
        at = f"{where}:{line + text.count(chr(10), 0, match.start())}"
        tag = AT_TAG.search(text[text.rfind(chr(10), 0, match.start()) + 1 : match.start()])
        study = (match.group(2) or "") + (f"@{tag[1]}" if tag else "")
        yield Named(at, "module", match.group(1), study)
    for match in SECTION.finditer(text):
        at = f"{where}:{line + text.count(chr(10), 0, match.start())}"
        page = "README.md" if match[1] == "README" else match[1]
        if "/" not in page and where.startswith("docs/"):
            page = f"docs/{page}"  # a page beside the citing one
        yield Named(at, "section", page, " ".join(match[2].split()))


def _run(where: str, line: int, code: str) -> Iterator[Named]:
    """The ``clip-gateway`` commands and ``make`` targets run in ``code``."""
    for kind, pattern in (("command", CLI), ("target", MAKE)):
        for match in pattern.finditer(code):
            yield Named(f"{where}:{line + code.count(chr(10), 0, match.start())}", kind, match[1])


def named(root: Path) -> list[Named]:
    """Every reference the pages and the code's prose make."""
    paths = path_pattern(subpackages(root))
    found: list[Named] = []
    for page in markdown_pages(root):
        text, where = page.read_text(), page.relative_to(root).as_posix()
        found += _read(where, 1, text, paths)
        for match in UPWARD.finditer(text):
            at = f"{where}:{1 + text.count(chr(10), 0, match.start())}"
            target = (page.parent / match.group()).resolve()
            if not target.is_relative_to(root.resolve()):
                found.append(Named(at, "outside", match.group()))
        for line, code in markdown_code(text):
            found += _run(where, line, code)
    for source in python_files(root):
        where = source.relative_to(root).as_posix()
        for line, text in python_prose(source.read_text()):
            found += _read(where, line, text, paths)
            for offset, code in code_spans(text):
                found += _run(where, line + offset, code)
    return found


# --- what each must resolve to -------------------------------------------------------------------


def expand(path: str) -> list[str]:
    """``a/{b,c}.json`` -> ``a/b.json``, ``a/c.json``."""
    brace = re.search(r"\{([^{}]*,[^{}]*)\}", path)
    if not brace:
        return [path]
    return [
        expanded
        for part in brace.group(1).split(",")
        for expanded in expand(path[: brace.start()] + part + path[brace.end() :])
    ]


def _plain(title: str) -> str:
    return " ".join(title.replace("`", "").lower().split()).rstrip(".:")


def sections(page: Path) -> list[str]:
    """The titles a page's sections go by: its headings and the bold words that open a paragraph
    or list item (``**API keys, required off loopback.**``)."""
    titles = []
    for previous, token in pairwise(PARSER.parse(page.read_text())):
        children = [c for c in token.children or [] if c.type != "text" or c.content]
        if previous.type == "heading_open":
            titles.append("".join(c.content for c in children if c.type in ("text", "code_inline")))
        elif token.type == "inline" and children and children[0].type == "strong_open":
            end = next(n for n, c in enumerate(children) if c.type == "strong_close")
            titles.append("".join(c.content for c in children[1:end]))
    return [_plain(title) for title in titles]


def section_problem(root: Path, page: str, title: str) -> str | None:
    """``title`` is a section of ``page``: a heading or bold lead-in it equals or begins (the
    citation may shorten ``Cluster (deploy/k8s/, kustomize)`` to ``Cluster``)."""
    if not (root / page).is_file():
        return f'{page} "{title}": no such page'
    cited = _plain(title)
    if not any(t == cited or re.match(rf"{re.escape(cited)}\b", t) for t in sections(root / page)):
        return f'{page} "{title}": no such section'
    return None


def written_by_runs(root: Path) -> tuple[str, ...]:
    """The entries .gitignore anchors at the root (``/bench/results/tmp/``): what runs write."""
    lines = (root / ".gitignore").read_text().splitlines()
    return tuple(line.strip().strip("/") for line in lines if line.startswith("/"))


def path_problem(root: Path, path: str) -> str | None:
    if path.split("/")[0] not in TOP:
        path = f"clip_gateway/{path}"
    written = written_by_runs(root)
    for one in expand(path):
        parts = one.rstrip("/").split("/")
        cut = next((n for n, part in enumerate(parts) if PLACEHOLDER.search(part)), len(parts))
        kept = "/".join(parts[:cut])
        if any(kept == w or kept.startswith(f"{w}/") for w in written):
            continue
        if "*" in kept:
            if not any(root.glob(kept)):
                return f"{one}: nothing matches"
        elif not (root / kept).exists():
            return f"{one}: no such file or folder"
    return None


def module_problem(root: Path, module: str, study: str, defined: Known) -> str | None:
    if module.split(".")[0] not in OWN_MODULES:
        return None  # pytest, pip, ...: another project's
    base = root.joinpath(*module.split("."))
    if not (base / "__main__.py").exists() and not base.with_suffix(".py").exists():
        return f"python -m {module}: no {module.replace('.', '/')}.py or __main__.py"
    if module == "bench" and "@" in study:
        study, tag = study.split("@")
        if tag != defined.tag or (study and study not in defined.concluded):
            return f"python -m bench {study} at {tag}: not a concluded study there"
    elif module == "bench" and study and study not in defined.studies:
        studies = sorted(defined.studies)
        return f"python -m bench {study}: no such study (bench/__main__.py has {studies})"
    return None


def make_targets(makefile: Path) -> frozenset[str]:
    """Every rule's targets (``a b: deps``), not variable assignments (``A := b``)."""
    targets: set[str] = set()
    for line in makefile.read_text().splitlines():
        rule = re.match(r"([^\s:#=][^:#=]*?)\s*::?(?!=)", line)
        if rule:
            targets.update(rule.group(1).split())
    return frozenset(targets)


def known(root: Path) -> Known:
    """What the CLI, bench and the Makefile define (the CLI's root and bench's parser imported:
    neither imports torch, Triton or the server)."""
    from bench.__main__ import COMMIT, CONCLUDED, _parser
    from clip_gateway.cli.main import CLIENT_COMMANDS, SERVER_COMMANDS

    subcommands = next(a for a in _parser()._actions if a.dest == "command")
    return Known(
        commands=frozenset({*CLIENT_COMMANDS, *SERVER_COMMANDS}),
        studies=frozenset(subcommands.choices or ()),
        targets=make_targets(root / "Makefile"),
        tag=COMMIT,
        concluded=frozenset(CONCLUDED),
    )


def problem(root: Path, ref: Named, defined: Known) -> str | None:
    if ref.kind == "path":
        return path_problem(root, ref.value)
    if ref.kind == "module":
        return module_problem(root, ref.value, ref.detail, defined)
    if ref.kind == "section":
        return section_problem(root, ref.value, ref.detail)
    if ref.kind == "outside":
        return f"{ref.value}: outside the repository"
    if ref.kind == "command":
        known_here, missing = defined.commands, f"clip-gateway {ref.value}: no such command"
    else:
        known_here, missing = defined.targets, f"make {ref.value}: no such target"
    return None if ref.value in known_here else missing


def problems(root: Path, defined: Known) -> list[str]:
    """Each reference that resolves to nothing, as ``file:line: what: why``, in file order."""
    found = {(ref.where, why) for ref in named(root) if (why := problem(root, ref, defined))}

    def by_place(item: tuple[str, str]) -> tuple[str, int, str]:
        file, line = item[0].rsplit(":", 1)
        return file, int(line), item[1]

    return [f"{where}: {why}" for where, why in sorted(found, key=by_place)]


@pytest.mark.slow
def test_every_named_path_and_command_exists() -> None:
    missing = problems(ROOT, known(ROOT))
    assert not missing, "named, but not in the repository:\n" + "\n".join(missing)


def test_top_is_every_top_level_folder() -> None:
    # a new top-level folder is added to TOP, so paths into it are checked too
    folders = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")}
    assert folders - set(written_by_runs(ROOT)) <= set(TOP)
    assert all((ROOT / top).is_dir() for top in TOP)


def test_the_check_finds_each_kind_of_break(tmp_path: Path) -> None:
    for folder in ("docs", "bench/results/smoke", "clip_gateway/http", "triton"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / ".gitignore").write_text("/bench/results/tmp/\n*.pyc\n")
    (tmp_path / "Makefile").write_text("A := b\nserve test: deps\n\t$(MAKE) x\n.PHONY: serve\n")
    for file in ("clip_gateway/http/app.py", "clip_gateway/http/__init__.py", "bench/__main__.py"):
        (tmp_path / file).write_text("")
    (tmp_path / "triton/README.md").write_text("# Triton\n")
    (tmp_path / "bench/README.md").write_text("# Bench\n\n| `python -m bench gone` | x |\n")
    (tmp_path / "docs/A.md").write_text(
        "# A\n\n"
        "Fine: docs/A.md, `http/app.py`, http/, bench/results/<suite>/, bench/results/tmp/x.json,\n"
        "~/docs/x.md, /opt/docs/y.md, https://example.com/docs/z.md, serve.py, ../README.md.\n"
        "Broken: docs/GONE.md, http/gone.py, bench/results/smoke/t.{json,md}, tests/*.py.\n\n"
        "```bash\n"
        "make serve && PORT=1 make nope    # the second fails\n"
        "clip-gateway serve; .venv/bin/clip-gateway nope\n"
        "kubectl -n clip-gateway create namespace x   # an argument, not a command\n"
        "echo 'run make again'\n"
        "python -m bench smoke && python -m bench peers\n"
        "python -m bench.gone; python -m pip x  # another project's module is not checked\n"
        "git checkout t1 && python -m bench old; git checkout t2 && .venv/bin/python -m bench old\n"
        "```\n\n"
        "## Cluster (kustomize)\n\n- **API keys, off loopback.** A bold lead-in is a section.\n"
    )
    (tmp_path / "README.md").write_text(
        "# R\n\nmake nothing here: it is prose, not code. See `../shared/NOTES.md`.\n"
    )
    (tmp_path / "clip_gateway/http/routes.py").write_text(
        '"""Routes (clip_gateway/http/old.py; ``make gone``): docs/A.md "Cluster", docs/A.md\n'
        '"API keys", README "Tests", docs/A.md "Clus".""" # a title cited may shorten, not cut\n'
        "PREFIX = 'clip_gateway/http/ap'  # data, not prose: clip_gateway/http/app.py\n"
        'MESSAGE = "see deploy/compose.yaml"\n'
        '#: a citation that wraps (README\n#: "Wrapped"), read as one\nX = 1\n'
    )
    targets = make_targets(tmp_path / "Makefile")
    defined = Known(frozenset({"serve"}), frozenset({"smoke"}), targets, "t1", frozenset({"old"}))
    assert defined.targets == {"serve", "test", ".PHONY"}
    assert problems(tmp_path, defined) == [
        "README.md:3: ../shared/NOTES.md: outside the repository",
        "bench/README.md:3: python -m bench gone: no such study (bench/__main__.py has ['smoke'])",
        "clip_gateway/http/routes.py:1: clip_gateway/http/old.py: no such file or folder",
        "clip_gateway/http/routes.py:1: make gone: no such target",
        'clip_gateway/http/routes.py:2: README.md "Tests": no such section',
        'clip_gateway/http/routes.py:2: docs/A.md "Clus": no such section',
        "clip_gateway/http/routes.py:4: deploy/compose.yaml: no such file or folder",
        'clip_gateway/http/routes.py:5: README.md "Wrapped": no such section',
        "docs/A.md:5: bench/results/smoke/t.json: no such file or folder",
        "docs/A.md:5: clip_gateway/http/gone.py: no such file or folder",
        "docs/A.md:5: docs/GONE.md: no such file or folder",
        "docs/A.md:5: tests/*.py: nothing matches",
        "docs/A.md:8: make nope: no such target",
        "docs/A.md:9: clip-gateway nope: no such command",
        "docs/A.md:12: python -m bench peers: no such study (bench/__main__.py has ['smoke'])",
        "docs/A.md:13: python -m bench.gone: no bench/gone.py or __main__.py",
        "docs/A.md:14: python -m bench old at t2: not a concluded study there",
    ]
