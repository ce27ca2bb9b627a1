"""Tests that fetch URLs or forward to an upstream run only inside a network namespace of their
own, with only loopback (tests/api/test_url_namespace.py starts them there through ``run.sh``):
whatever the guard lets through, nothing can leave this machine. Collected anywhere else, they
are not collected; started with the namespace flag outside one, the session stops at once."""

from __future__ import annotations

import os
import socket

import pytest

IN_NAMESPACE = os.environ.get("CLIP_GATEWAY_NETNS") == "1"

if not IN_NAMESPACE:
    collect_ignore_glob = ["test_*.py"]


def pytest_configure(config: pytest.Config) -> None:
    if IN_NAMESPACE:
        interfaces = sorted(name for _, name in socket.if_nameindex())
        if interfaces != ["lo"]:
            pytest.exit(f"not in an isolated network namespace: {interfaces}", returncode=3)
