"""config/processes.py: the listening socket the launcher hands the HTTP process, and
stop_with_parent (a child started with it gets SIGTERM when its parent dies, and one whose parent
is already gone does not run at all)."""

from __future__ import annotations

import functools
import os
import socket
import subprocess
import sys

import pytest

from clip_gateway.config.processes import listening_socket, stop_with_parent

#: prctl(PR_GET_PDEATHSIG) from inside the child: the signal it gets when its parent dies
PRINT_SIGNAL = (
    "import ctypes; s = ctypes.c_int(); ctypes.CDLL(None).prctl(2, ctypes.byref(s)); print(s.value)"
)


@pytest.mark.skipif(sys.platform != "linux", reason="prctl is Linux's")
def test_a_child_gets_sigterm_when_its_parent_dies() -> None:
    child = subprocess.run(
        [sys.executable, "-c", PRINT_SIGNAL],
        preexec_fn=functools.partial(stop_with_parent, os.getpid()),
        capture_output=True,
        text=True,
        check=True,
    )
    assert child.stdout.strip() == "15"


@pytest.mark.skipif(sys.platform != "linux", reason="prctl is Linux's")
def test_a_child_whose_parent_is_already_gone_exits_before_it_runs() -> None:
    # pid 1 is never this test's process: the child sees a parent other than the one named
    child = subprocess.run(
        [sys.executable, "-c", "print('ran')"],
        preexec_fn=functools.partial(stop_with_parent, 1),
        capture_output=True,
        text=True,
    )
    assert (child.returncode, child.stdout) == (1, "")


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_accepted_connections_send_without_nagle(host: str) -> None:
    """uvicorn wraps a passed fd as AF_UNIX, so asyncio never sets TCP_NODELAY on what it
    accepts; the option must come from the listening socket, or every response a keep-alive
    client waits for is held ~40 ms for its delayed ACK (measured: 72 ms vs 28 ms per
    single-image request on cpu-int8)."""
    try:
        server = listening_socket(host)
    except OSError:
        pytest.skip(f"no {host} on this machine")
    with server, socket.create_connection(server.getsockname()[:2]):
        assert server.get_inheritable()  # for the HTTP process
        accepted, _ = server.accept()
        with accepted:
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
