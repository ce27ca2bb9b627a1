"""The baked export (GATEWAY_MODEL_DIR, clip_gateway/launcher/served_export.py): one the
launcher's user cannot read is a start-up error naming the path, its mode and owner, not a
PermissionError."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from clip_gateway.config.processes import LaunchError
from clip_gateway.config.settings import LaunchSettings
from clip_gateway.launcher import served_export
from tests.unprivileged import as_unprivileged, open_directory


def baked(parent: Path, mode: int) -> Path:
    """An export directory as `python -m clip_gateway.export` leaves it (mkdtemp: 0700), then
    ``mode``."""
    export = parent / "export"
    export.mkdir()
    (export / "manifest.json").write_text(json.dumps({"model": "ViT-B-32"}))
    (export / "1").mkdir()
    (export / "1" / "model.onnx").write_bytes(b"graph")
    for path in (export / "manifest.json", export / "1" / "model.onnx"):
        path.chmod(0o644)
    (export / "1").chmod(0o755)
    export.chmod(mode)
    return export


def find(directory: Path) -> str:
    launch = LaunchSettings(model_dir=directory)
    try:
        return str(served_export.find_or_export(launch, lambda line: None, threading.Event()))
    except LaunchError as exc:
        return f"LaunchError: {exc}"


def test_a_private_export_is_a_launch_error_naming_mode_and_owner() -> None:
    with open_directory() as parent:
        export = baked(parent, 0o700)
        answer = as_unprivileged(lambda: find(export))
    assert answer.startswith(f"LaunchError: the export {export} is not readable by uid 65534")
    assert "has mode 0700, owner uid" in answer and "chmod -R a+rX" in answer


def test_an_unreadable_file_inside_is_named() -> None:
    with open_directory() as parent:
        export = baked(parent, 0o755)
        (export / "1" / "model.onnx").chmod(0o600)
        answer = as_unprivileged(lambda: find(export))
    assert f"{export / '1' / 'model.onnx'} has mode 0600" in answer


def test_a_readable_export_is_served_as_it_is(tmp_path: Path) -> None:
    with open_directory() as parent:
        export = baked(parent, 0o755)
        assert as_unprivileged(lambda: find(export)) == str(export)
    assert find(tmp_path / "missing").startswith("LaunchError: ")
    assert "is not an export" in find(tmp_path / "missing")
