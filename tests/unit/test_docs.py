"""The docs document every setting the code reads (no silent drift): docs/SETTINGS.md lists
each one, and the README states the two commands a newcomer runs."""

from __future__ import annotations

from pathlib import Path

from clip_gateway.config.settings import LaunchSettings, RepositorySettings, ServerSettings

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
SETTINGS = (ROOT / "docs" / "SETTINGS.md").read_text()


def test_every_gateway_setting_is_documented() -> None:
    missing = [
        name for name in ServerSettings.model_fields if f"GATEWAY_{name.upper()}" not in SETTINGS
    ]
    assert not missing


def test_every_repository_setting_is_documented() -> None:
    missing = [
        name for name in RepositorySettings.model_fields if f"`{name.upper()}`" not in SETTINGS
    ]
    assert not missing


def test_readme_states_the_two_commands() -> None:
    assert "make serve" in README
    assert "make test" in README


def test_every_launch_setting_is_documented() -> None:
    missing = [
        name for name in LaunchSettings.model_fields if f"GATEWAY_{name.upper()}" not in SETTINGS
    ]
    assert not missing
