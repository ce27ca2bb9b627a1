"""Per-module table of the last `mutmut run` (`make mutation` prints it after `mutmut results`).

Score = detected / (detected + undetected), where detected = killed + timeout (+ segfault, a test
process that crashed) and undetected = survived + "no tests" (a mutant no selected test even
executes is one no test would notice). Suspicious, skipped and unchecked mutants are shown but
left out of the score.
"""

from __future__ import annotations

import json
import sys
import tomllib
from collections import Counter
from pathlib import Path

from mutmut.stats import status_by_exit_code

DETECTED = ("killed", "timeout", "segfault")
UNDETECTED = ("survived", "no tests")
COLUMNS = ("killed", "survived", "timeout", "no tests", "suspicious", "segfault")


def main(root: Path = Path()) -> int:
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["mutmut"]
    rows, total = [], Counter[str]()
    for module in config["only_mutate"]:
        meta = root / "mutants" / f"{module}.meta"
        if not meta.exists():
            print(f"{meta}: missing; run `mutmut run` first", file=sys.stderr)
            return 1
        codes = json.loads(meta.read_text())["exit_code_by_key"].values()
        counts = Counter(status_by_exit_code[code] for code in codes)
        counts["generated"] = len(codes)
        rows.append((module, counts))
        total.update(counts)
    rows.append(("total", total))
    header = f"{'module':<34}{'generated':>10}" + "".join(f"{c:>11}" for c in COLUMNS)
    print(header + f"{'score':>8}")
    for module, counts in rows:
        detected = sum(counts[s] for s in DETECTED)
        judged = detected + sum(counts[s] for s in UNDETECTED)
        score = f"{100 * detected / judged:.1f}%" if judged else "-"
        cells = "".join(f"{counts[c]:>11}" for c in COLUMNS)
        print(f"{module:<34}{counts['generated']:>10}{cells}{score:>8}")
    return 0


def survivors(root: Path = Path()) -> str:
    """Markdown: every undetected mutant of the last run, as the lines it changes, by function
    (``mutmut show`` for each), for tests/mutation-report.md."""
    import subprocess

    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["mutmut"]
    out = []
    for module in config["only_mutate"]:
        codes = json.loads((root / "mutants" / f"{module}.meta").read_text())["exit_code_by_key"]
        left = sorted(
            (k for k, code in codes.items() if status_by_exit_code[code] in UNDETECTED),
            key=lambda k: (k.rsplit("__mutmut_", 1)[0], int(k.rsplit("_", 1)[1])),
        )
        out.append(f"\n## {module}: {len(left)} undetected\n")
        for key in left:
            shown = subprocess.run(
                [sys.executable, "-m", "mutmut", "show", key], capture_output=True, text=True
            ).stdout.splitlines()
            changed = [line for line in shown if line[:1] in "-+" and line[:3] not in "---+++"]
            out.append(f"- `{key.split('.x', 1)[-1]}`")
            out += [f"  `{line.strip()}`" for line in changed]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] == ["--survivors"]:
        print(survivors())
        sys.exit(0)
    sys.exit(main())
