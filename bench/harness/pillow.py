"""Stock Pillow beside the venv's pillow-simd: installed in a folder of its own, put first on a
child process's ``PYTHONPATH`` (what a fresh machine would run, and what the baselines use)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

STOCK_PILLOW = "pillow==12.1.1"


def with_stock_pillow(stock: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(stock)] if stock else []
    env["PYTHONPATH"] = os.pathsep.join([*paths, str(ROOT), env.get("PYTHONPATH", "")]).strip(
        os.pathsep
    )
    return env


def stock_pillow(cache: Path) -> Path | None:
    """Stock Pillow in a directory of its own, for the baselines (the venv has pillow-simd)."""
    target = cache / "bench" / "stock-pillow-12.1.1"
    if not (target / "PIL").exists():
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-deps",
                "--target",
                str(target),
                STOCK_PILLOW,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            print(f"warning: stock Pillow unavailable ({done.stderr.strip()[-200:]})", flush=True)
            return None
    return target
