"""The listening socket the launcher hands the HTTP process (config/processes.py)."""

from __future__ import annotations

import socket

import pytest

from clip_gateway.config.processes import listening_socket


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
