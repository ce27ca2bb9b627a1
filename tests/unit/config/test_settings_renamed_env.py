"""A renamed environment variable (config/settings.py RENAMED_ENV): the old name users set is
still honoured, with one warning per process; the new name wins when both are set."""

from __future__ import annotations

import logging

import pytest

from clip_gateway.config import settings
from clip_gateway.config.settings import RENAMED_ENV, ServerSettings

OLD, NEW = "GATEWAY_MAX_IMAGES_PER_REQUEST", "GATEWAY_MAX_ITEMS_PER_REQUEST"


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (OLD, NEW):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(settings, "_warned", set())  # as in a new process


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_the_old_name_is_honoured_and_warned_of_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    assert RENAMED_ENV[OLD] == NEW
    monkeypatch.setenv(OLD, "7")
    with caplog.at_level(logging.WARNING, logger=settings.__name__):
        assert ServerSettings().max_items_per_request == 7
        assert ServerSettings().max_items_per_request == 7  # read again: no second warning
    assert warnings_of(caplog) == [f"{OLD} is deprecated: set {NEW} instead"]


def test_the_new_name_wins_over_the_old(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(OLD, "7")
    monkeypatch.setenv(NEW, "9")
    with caplog.at_level(logging.WARNING, logger=settings.__name__):
        assert ServerSettings().max_items_per_request == 9
    assert warnings_of(caplog) == [f"{OLD} is set and ignored: {NEW}, its new name, is set too"]


def test_the_new_name_alone_warns_of_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(NEW, "9")
    with caplog.at_level(logging.WARNING, logger=settings.__name__):
        assert ServerSettings().max_items_per_request == 9
        assert ServerSettings(max_items_per_request=3).max_items_per_request == 3  # a flag wins
    assert warnings_of(caplog) == []


def test_a_value_given_wins_over_the_old_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(OLD, "7")
    assert ServerSettings(max_items_per_request=3).max_items_per_request == 3


def test_children_get_the_new_name_only() -> None:
    """The process that read the old name warned; its children (uvicorn's workers, the
    supervisor's gateway) are started with the new one and warn of nothing."""
    assert settings.with_new_names({OLD: "7", "OTHER": "x"}) == {NEW: "7", "OTHER": "x"}
    assert settings.with_new_names({OLD: "7", NEW: "9"}) == {NEW: "9"}
    assert settings.with_new_names({NEW: "9"}) == {NEW: "9"}
