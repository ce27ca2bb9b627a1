"""``python -m bench.harness.child STUDY ARGS...``: a process a study starts for a piece of its own
work (a load generator on a core of its own): the study module's
``child(argv)``, whose return is this process's exit status. A person starts a study only through
``python -m bench STUDY``; no study module is a script of its own."""

from __future__ import annotations

import importlib
import sys


def main(argv: list[str]) -> int:
    study = importlib.import_module(f"bench.studies.{argv[0]}")
    status: int = study.child(argv[1:])
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
