"""Tests that fetch URLs or forward to an upstream run only inside a network namespace of their
own, with only loopback (test_url_namespace.py, beside them, starts them there through
``run.sh``): whatever the guard lets through, nothing can leave this machine. Anywhere else,
they are not collected; started with the namespace flag outside one, the session stops at once."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

IN_NAMESPACE = os.environ.get("CLIP_GATEWAY_NETNS") == "1"

#: The one module collected outside the namespace: it starts the others inside one (``run.sh``),
#: and is never collected there (it would start the namespace again from inside).
LAUNCHER = "test_url_namespace.py"
if IN_NAMESPACE:
    collect_ignore = [LAUNCHER]
else:
    collect_ignore = sorted(
        path.name for path in Path(__file__).parent.glob("test_*.py") if path.name != LAUNCHER
    )


def pytest_configure(config: pytest.Config) -> None:
    if IN_NAMESPACE:
        interfaces = sorted(name for _, name in socket.if_nameindex())
        if interfaces != ["lo"]:
            pytest.exit(f"not in an isolated network namespace: {interfaces}", returncode=3)
