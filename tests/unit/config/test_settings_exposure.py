"""Secure by default: without an API key the gateway serves loopback only, unless told."""

from __future__ import annotations

from pathlib import Path

import pytest

from clip_gateway.config.settings import ServerSettings, exposure_problem, is_loopback


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.53", "::1", "[::1]", "localhost"])
def test_loopback_needs_no_key(host: str) -> None:
    assert is_loopback(host)
    assert exposure_problem(ServerSettings(host=host)) is None


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.7", "gateway.internal", ""])
def test_any_other_address_needs_a_key_or_the_anonymous_flag(host: str) -> None:
    problem = exposure_problem(ServerSettings(host=host))
    assert problem is not None and "no API key configured" in problem
    assert "GATEWAY_ANONYMOUS=true" in problem and "GATEWAY_API_KEYS_FILE" in problem
    assert exposure_problem(ServerSettings(host=host, anonymous=True)) is None
    assert exposure_problem(ServerSettings(host=host, api_keys=("k1",))) is None


def test_a_keys_file_counts_only_if_it_holds_a_key(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# rotate monthly\n\n   \n")
    problem = exposure_problem(ServerSettings(host="0.0.0.0", api_keys_file=keys))
    assert problem is not None and f"{keys} holds none" in problem
    keys.write_text("# rotate monthly\nsecret-1  # prometheus\n")
    assert exposure_problem(ServerSettings(host="0.0.0.0", api_keys_file=keys)) is None


def test_an_unreadable_keys_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "absent"
    problem = exposure_problem(ServerSettings(host="127.0.0.1", api_keys_file=missing))
    assert problem is not None and "GATEWAY_API_KEYS_FILE cannot be read" in problem
    assert str(missing) in problem


def test_the_http_process_run_by_hand_refuses_an_open_address_without_keys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`python -m clip_gateway.http` holds the same rule as the launcher, before binding
    anything."""
    from clip_gateway.http import __main__ as http_main

    for name in ("GATEWAY_API_KEYS", "GATEWAY_API_KEYS_FILE", "GATEWAY_ANONYMOUS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GATEWAY_HOST", "0.0.0.0")
    monkeypatch.setattr(http_main.uvicorn, "run", lambda *a, **k: pytest.fail("bound anyway"))
    with pytest.raises(SystemExit, match="not a loopback address"):
        http_main.main()
