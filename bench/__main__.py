"""``python -m bench run --suite smoke|quick|full [--out DIR] [--profile cpu|cuda|tensorrt]``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.suites import SUITES

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="every system, every table, one report")
    run.add_argument("--suite", choices=sorted(SUITES), default="quick")
    run.add_argument("--out", type=Path, default=None, help="default: bench/results/<suite>")
    run.add_argument(
        "--profile",
        choices=("cpu", "cuda", "tensorrt"),
        default="cpu",
        help="Triton profile for B and C (GPU profiles need the NGC tritonserver)",
    )
    args = parser.parse_args(argv)
    from bench import runner

    runner.run(args.suite, args.out or RESULTS / args.suite, args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
