"""`pip install clip-gateway` in a fresh virtualenv: the wheel holds only the packages, the
install holds no server or export dependency, and the client suite (tests/client) passes
against the real server of the full install."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(*command: str | Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(c) for c in command],
        capture_output=True,
        text=True,
        timeout=900,
        **kwargs,  # type: ignore[call-overload]
    )


def test_client_only_install_against_a_real_server(gateway, tmp_path: Path) -> None:
    built = run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", tmp_path / "dist", ROOT)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("clip_gateway-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names if not name.startswith("clip_gateway-")}
    assert tops == {"clip_gateway"}, tops  # no tests, bench or deploy files
    assert any(name.startswith("clip_gateway/_triton/profiles/") for name in names)

    env_dir = tmp_path / "client-venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    installed = run(python, "-m", "pip", "install", "--quiet", wheel, "pytest")
    assert installed.returncode == 0, installed.stderr[-2000:]
    suite = ROOT / "tests" / "client"
    env = {
        # not this run's PYTEST_ADDOPTS: its plugins' flags (pytest-randomly's --randomly-seed)
        # are unknown to the client venv's bare pytest
        **{k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"},
        "CLIP_GATEWAY_URL": gateway.url,
        "PATH": f"{env_dir / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(suite),  # its conftest helpers, nothing of the repository
        "VIRTUAL_ENV": str(env_dir),
    }
    done = run(
        python, "-m", "pytest", suite, "-q", "-p", "no:cacheprovider", "--confcutdir", suite,
        "--rootdir", suite, "-c", os.devnull, cwd=tmp_path, env=env,
    )  # fmt: skip
    print(done.stdout[-1500:])
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
