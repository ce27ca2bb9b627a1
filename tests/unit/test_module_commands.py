"""Every `python -m MODULE` the package runs as a child process names a module that exists (the
launcher's export child named the old `export` package after the namespace move)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHILD = re.compile(r'"-m",\s*"([\w.]+)"')


def test_every_child_module_the_package_starts_exists() -> None:
    found = {
        (path.relative_to(ROOT).as_posix(), module)
        for path in (ROOT / "clip_gateway").rglob("*.py")
        for module in CHILD.findall(path.read_text())
    }
    assert found, "no child process command found: the pattern is stale"
    missing = [(path, module) for path, module in found if importlib.util.find_spec(module) is None]
    assert missing == []
