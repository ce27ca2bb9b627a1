"""Connections spread evenly over workers (http/spread.py): the board the workers share, and
acceptors on one real listening socket, on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from clip_gateway.http import spread


@pytest.fixture
def board(tmp_path: Path) -> Path:
    path = tmp_path / "connections"
    spread.Board.create(path, 2)
    return path


@pytest.fixture
def other_process() -> Iterator[int]:
    """A live process that is not this one: a worker that never accepts (a stuck one)."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield process.pid
    finally:
        process.kill()
        process.wait()


def accepting(path: Path) -> tuple[int, int]:
    with contextlib.closing(spread.Board(path)) as board:
        return board.accepting()


def gone_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_each_worker_sees_who_has_fewer_connections(board: Path) -> None:
    first, second = spread.Board(board), spread.Board(board)
    first.claim()
    second.claim()  # this process holds both: each is a slot of its own
    assert (first.mine, second.mine) == (1, 2)
    assert first.accepting() == (2, 2)
    first.publish(3)
    second.publish(1)
    assert first.fewer_elsewhere(3) and not first.fewer_elsewhere(1)
    assert second.fewer_elsewhere(4) and not second.fewer_elsewhere(3)
    second.release()  # stopped accepting: no longer counted, nor waited for
    assert first.accepting() == (1, 2) and not first.fewer_elsewhere(3)
    first.close()
    second.close()


def test_a_dead_workers_slot_is_free_and_never_waited_for(board: Path) -> None:
    dead = spread.Board(board)
    dead.claim(pid=gone_pid())  # a worker killed with its slot still claimed
    dead.publish(0)
    live = spread.Board(board)
    live.claim()
    assert live.mine == 1  # the dead worker's slot, taken again
    assert live.accepting() == (1, 2)
    other = spread.Board(board)
    other.claim(pid=gone_pid())
    other.publish(0)
    assert not live.fewer_elsewhere(5)  # a dead worker's 0 holds no connection back
    for each in (dead, live, other):
        each.close()


def test_a_full_board_refuses_another_worker(tmp_path: Path, other_process: int) -> None:
    path = tmp_path / "connections"
    spread.Board.create(path, 1)  # room for two: a replacement before its predecessor is reaped
    boards = [spread.Board(path) for _ in range(3)]
    boards[0].claim()
    boards[1].claim(pid=other_process)
    with pytest.raises(RuntimeError, match="no free slot"):
        boards[2].claim()
    for each in boards:
        each.close()


class Held(asyncio.Protocol):
    """A connection that stays open until the client closes it."""


async def accepted(acceptors: list[spread.Acceptor], total: int) -> list[int]:
    for _ in range(500):
        counts = [acceptor.connections for acceptor in acceptors]
        if sum(counts) >= total:
            return counts
        await asyncio.sleep(0.01)
    raise AssertionError(f"accepted {counts}, not {total}")


def listening() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    return sock


def test_acceptors_count_their_connections_in_and_out(board: Path) -> None:
    """Two acceptors of one socket (as two workers' are): eight connections opened at once,
    four each; each one counted out as its client leaves; their slots freed when they close."""

    async def run() -> None:
        loop = asyncio.get_running_loop()
        sock = listening()
        acceptors = [spread.Acceptor(loop, sock, Held, spread.Board(board)) for _ in range(2)]
        for acceptor in acceptors:
            acceptor.start()
        port = sock.getsockname()[1]
        try:
            clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(8)]
            assert sorted(await accepted(acceptors, 8)) == [4, 4]
            assert accepting(board) == (2, 2)
            for client in clients[:3]:
                client.close()
            assert sum(await accepted_down(acceptors, 5)) == 5
            for client in clients[3:]:
                client.close()
            await accepted_down(acceptors, 0)
        finally:
            for acceptor in acceptors:
                acceptor.close()
            sock.close()
        assert accepting(board) == (0, 2)

    asyncio.run(run())


@contextlib.asynccontextmanager
async def beside_another(
    board: Path, pid: int, count: int
) -> AsyncIterator[tuple[spread.Acceptor, spread.Board, int]]:
    """An acceptor on a listening socket of its own, its port, and another worker's slot
    (``pid``, ``count`` open connections); the clients close theirs before it ends."""
    other = spread.Board(board)
    other.claim(pid=pid)
    other.publish(count)
    sock = listening()
    acceptor = spread.Acceptor(asyncio.get_running_loop(), sock, Held, spread.Board(board))
    acceptor.start()
    try:
        yield acceptor, other, sock.getsockname()[1]
    finally:
        await accepted_down([acceptor], 0)
        acceptor.close()
        other.close()
        sock.close()


def test_a_worker_takes_connections_only_while_no_other_has_fewer(
    board: Path, other_process: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another worker holds two connections: this one takes three (while level, it may take
    the next), leaves the fourth waiting for the other, and takes it once the other has more."""
    monkeypatch.setattr(spread, "PATIENCE_S", 30.0)  # the other worker is not stuck here

    async def run() -> None:
        async with beside_another(board, other_process, 2) as (acceptor, other, port):
            clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
            try:
                assert await accepted([acceptor], 3) == [3]
                await asyncio.sleep(0.3)
                assert acceptor.connections == 3  # the fourth waits for the worker with fewer
                other.publish(5)
                assert await accepted([acceptor], 4) == [4]
            finally:
                for client in clients:
                    client.close()

    asyncio.run(run())


async def accepted_down(acceptors: list[spread.Acceptor], total: int) -> list[int]:
    for _ in range(500):
        counts = [acceptor.connections for acceptor in acceptors]
        if sum(counts) <= total:
            return counts
        await asyncio.sleep(0.01)
    raise AssertionError(f"still {counts}, not {total}")


def test_no_connection_waits_on_a_worker_that_never_accepts(
    board: Path, other_process: int
) -> None:
    """The least loaded worker is stuck (a process that holds a slot and never accepts): a
    connection is left to it for ``PATIENCE_S``, then taken."""

    async def run() -> None:
        async with beside_another(board, other_process, 0) as (acceptor, _, port):
            clients = [socket.create_connection(("127.0.0.1", port))]
            try:
                assert await accepted([acceptor], 1) == [1]  # level with the stuck one: taken
                started = time.monotonic()
                clients.append(socket.create_connection(("127.0.0.1", port)))
                assert await accepted([acceptor], 2) == [2]
                assert time.monotonic() - started >= spread.PATIENCE_S * 0.9  # left to it first
            finally:
                for client in clients:
                    client.close()

    asyncio.run(run())
