"""Which tritonserver the launcher runs (clip_gateway/launcher/local.py, TritonInstall.discover)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from clip_gateway.backend import shm
from clip_gateway.launcher import local


def test_in_an_ngc_image_python_models_run_the_bases_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The image puts the gateway's virtualenv first on PATH; the Python backend's stub takes
    python3 from PATH, so Triton gets the base's /usr/bin first (its python3 has the backend's
    packages; the virtualenv has neither numpy<2 nor ONNX Runtime)."""
    server = tmp_path / "opt" / "tritonserver" / "bin" / "tritonserver"
    server.parent.mkdir(parents=True)
    server.touch()
    monkeypatch.setattr(local, "NGC_SERVER", server)
    monkeypatch.delenv("TRITONSERVER", raising=False)
    install = local.TritonInstall.discover()
    assert install.server == server
    assert install.backend_dir == tmp_path / "opt" / "tritonserver" / "backends"
    assert install.python_bin_dir == Path("/usr/bin")
    triton = local.LocalTriton(tmp_path / "repository", install=install)
    monkeypatch.setenv("PATH", "/opt/venv/bin:/usr/local/bin:/usr/bin")
    assert triton.environment()["PATH"].split(":")[:2] == ["/usr/bin", "/opt/venv/bin"]


def _exited_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_only_the_regions_of_tritons_whose_launcher_is_gone_are_removed(tmp_path: Path) -> None:
    gone, running = _exited_pid(), os.getppid()
    names = {
        f"{local.SHM_PREFIX}{gone}_0123abcd_7e1f-uuid": False,  # its launcher exited: removed
        f"{local.SHM_PREFIX}{gone}_89abcdef_0000-uuid": False,
        f"{local.SHM_PREFIX}{running}_0123abcd_7e1f-uuid": True,  # a running launcher's
        f"{local.SHM_PREFIX}{os.getpid()}_0123abcd_7e1f-uuid": True,  # this process's own
        f"triton_python_backend_shm_region_{gone}": True,  # not one of ours
        f"clipgw_{gone}_0123456789abcdef": True,  # the gateway's batches: backend/shm.py's
        f"{local.SHM_PREFIX}{gone}_notatoken_x": True,  # not a name we make
    }
    for name in names:
        (tmp_path / name).write_bytes(b"\0" * 64)
    assert all(shm.owner(n) is None for n in names if n.startswith(local.SHM_PREFIX))  # not ours
    assert local.remove_orphaned_regions(tmp_path) == 2
    assert {p.name for p in tmp_path.iterdir()} == {n for n, kept in names.items() if kept}


def test_a_servers_regions_are_those_its_prefix_names(tmp_path: Path) -> None:
    triton = local.LocalTriton(tmp_path / "repository", install=_install(tmp_path))
    other = local.LocalTriton(tmp_path / "repository", install=_install(tmp_path))
    assert triton.shm_prefix != other.shm_prefix
    assert triton.shm_prefix.startswith(f"{local.SHM_PREFIX}{os.getpid()}_")
    assert f"--backend-config=python,shm-region-prefix-name={triton.shm_prefix}" in (
        triton.command()
    )
    for server in (triton, other):
        (tmp_path / f"{server.shm_prefix}1b2c-uuid").touch()
    assert local.remove_regions(triton.shm_prefix, tmp_path) == 1
    assert [p.name for p in tmp_path.glob(f"{local.SHM_PREFIX}*")] == [
        f"{other.shm_prefix}1b2c-uuid"
    ]


def _install(root: Path) -> local.TritonInstall:
    return local.TritonInstall(server=root / "tritonserver", backend_dir=root / "backends")
