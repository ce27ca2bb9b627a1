"""Which tritonserver the launcher runs (clip_gateway/launcher/local.py, TritonInstall.discover)."""

from __future__ import annotations

from pathlib import Path

import pytest

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
