"""The image path the gateway reports (clip_gateway/imaging/paths.py) and how the install gets the
fast one (requirements/pillow-simd.sh): packages installed where it may, a clear refusal
otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import PIL
import PIL.Image
import pytest

from clip_gateway.imaging import paths

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "requirements" / "pillow-simd.sh"


def test_the_reported_path_is_the_distribution_of_the_imported_pil() -> None:
    path = paths.current()
    name, _, version = path.resize.partition(" ")
    assert name in ("pillow", "pillow-simd")
    assert version == PIL.__version__
    assert path.simd == (name == "pillow-simd")
    assert path.decode.startswith("JPEG: libjpeg-turbo (simplejpeg ")


def test_a_pil_built_without_webp_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    # pillow-simd built where libwebp's headers were missing: /v1/models and the ready line
    # must not claim WebP (such a server answers a WebP upload with 415)
    PIL.Image.init()
    assert "PNG/WebP/GIF: " in paths.current().decode
    monkeypatch.delitem(PIL.Image.OPEN, "WEBP")
    paths.current.cache_clear()
    try:
        assert "; PNG/GIF (no WebP: built without it): " in paths.current().decode
    finally:
        paths.current.cache_clear()


def _fake_pil(site: Path, distribution: str, version: str) -> None:
    (site / "PIL").mkdir(parents=True)
    (site / "PIL" / "__init__.py").write_text(f"__version__ = {version!r}\n")
    info = site / f"{distribution.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n"
    )


@pytest.mark.parametrize(
    ("distribution", "version", "code"),
    [("pillow", "12.1.1", 1), ("pillow-simd", "12.1.1.post0", 0)],
)
def test_the_check_names_the_pil_that_shadows_the_venvs_and_requires_simd(
    tmp_path: Path, distribution: str, version: str, code: int
) -> None:
    # a PIL first on the path is the one imported: the check reports it, not the venv's
    _fake_pil(tmp_path, distribution, version)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    done = subprocess.run(
        [sys.executable, "-m", "clip_gateway", "imaging", "--require-simd"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == code, done.stderr
    assert f'"resize": "{distribution} {version}"' in done.stdout
    assert ("not pillow-simd" in done.stderr) == (code == 1)


def _tools(bin_dir: Path, *, uid: int, headers_after_apt: bool, wheel_fails: bool = False) -> Path:
    """Stand-ins for cc, id, sudo, apt-get and the venv's python that record their calls; cc
    finds the headers only once apt-get has run (when ``headers_after_apt``)."""
    bin_dir.mkdir()
    calls = bin_dir / "calls"
    include = bin_dir / "include"
    include.mkdir()
    (include / "Python.h").write_text("")
    scripts = {
        "cc": f"[ -f {bin_dir}/installed ] && {str(headers_after_apt).lower()} && exit 0; exit 1",
        "id": f"echo {uid}",
        "sudo": "exit 1",  # no passwordless sudo
        "apt-get": f'echo "apt-get $*" >> {calls}; touch {bin_dir}/installed',
        # -c: the include path; -I -S -c: sys._base_executable (itself); -m venv: a venv whose
        # python is this stand-in too, recorded as venv-python
        "python": f"""[ "$1" = -c ] && {{ echo {include}; exit 0; }}
[ "$1" = -I ] && {{ echo "$0"; exit 0; }}
who=python; [ "$0" = {bin_dir}/python ] || who=venv-python
[ "$1 $2" = "-m venv" ] && {{ mkdir -p "$3/bin"; cp "$0" "$3/bin/python"; }}
echo "$who $*" >> {calls}
[ "$who $1 $2 $3" = "venv-python -m pip wheel" ] && {str(wheel_fails).lower()} && {{
  echo "gcc: fatal error: cc1 exploded"; exit 1; }}
exit 0""",
    }
    for name, body in scripts.items():
        tool = bin_dir / name
        tool.write_text(f"#!/bin/bash\n{body}\n")
        tool.chmod(0o755)
    return calls


def _install(bin_dir: Path) -> subprocess.CompletedProcess[str]:
    """The Makefile's two steps: the wheel built, then installed (only if it was)."""
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(bin_dir)}
    python, wheels = str(bin_dir / "python"), str(bin_dir / "wheels")
    done = subprocess.run(
        ["bash", str(SCRIPT), "build", python, "12.1.1.post0", "-mavx2", wheels],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        return done
    return subprocess.run(
        ["bash", str(SCRIPT), "install", python, "12.1.1.post0", wheels],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def test_without_root_or_sudo_the_install_refuses_and_names_the_packages(tmp_path: Path) -> None:
    calls = _tools(tmp_path / "bin", uid=1000, headers_after_apt=True)
    done = _install(tmp_path / "bin")
    assert done.returncode == 1
    assert "libwebp-dev zlib1g-dev libjpeg-dev" in done.stderr
    assert "PILLOW_SIMD=0" in done.stderr
    assert not calls.exists()  # neither apt-get nor pip ran: stock Pillow was left untouched


def test_as_root_the_install_gets_the_packages_then_builds_and_checks(tmp_path: Path) -> None:
    calls = _tools(tmp_path / "bin", uid=0, headers_after_apt=True)
    done = _install(tmp_path / "bin")
    assert done.returncode == 0, done.stderr
    lines = calls.read_text().splitlines()
    assert lines[0].startswith("apt-get install -y")
    assert lines[0].endswith("libwebp-dev zlib1g-dev libjpeg-dev")
    # the wheel is built by a venv of its own, not by the one being installed meanwhile
    assert lines[1].startswith("python -m venv ")
    assert lines[2].startswith("venv-python -m pip wheel")
    assert "pillow-simd==12.1.1.post0" in lines[2]
    assert lines[3].startswith("python -m pip uninstall")
    assert lines[4].startswith("python -m pip install") and "--no-index" in lines[4]
    assert lines[-1] == "python -m clip_gateway imaging --require-simd"


def test_a_failed_wheel_build_shows_its_output_and_installs_nothing(tmp_path: Path) -> None:
    calls = _tools(tmp_path / "bin", uid=0, headers_after_apt=True, wheel_fails=True)
    done = _install(tmp_path / "bin")
    assert done.returncode == 1
    assert "gcc: fatal error: cc1 exploded" in done.stderr  # the build's own words
    assert "building pillow-simd 12.1.1.post0 failed" in done.stderr
    assert "PILLOW_SIMD=0" in done.stderr
    assert not any("pip install" in line for line in calls.read_text().splitlines())


def test_packages_still_missing_after_apt_stop_the_install(tmp_path: Path) -> None:
    calls = _tools(tmp_path / "bin", uid=0, headers_after_apt=False)
    done = _install(tmp_path / "bin")
    assert done.returncode == 1
    assert "still missing after apt-get" in done.stderr
    assert not any(line.startswith("python -m pip") for line in calls.read_text().splitlines())
