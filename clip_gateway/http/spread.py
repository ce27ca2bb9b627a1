"""Connections spread evenly over the gateway's worker processes.

uvicorn's workers share one listening socket, and the worker that wakes first for a new
connection accepts every connection then waiting. A burst of keep-alive clients (the bench's, an
Immich server's job pool) lands on that one worker, and a keep-alive connection never moves: here
16 clients opened at once all landed on one worker of four, which decoded every request while
the others idled (1,524 images/s; spread 9/6/1 on the next runs, 2,565). On the 16-core H200
host, 8 workers served fewer images/s than 1 (bench/results/host/host.md).

Here each worker accepts one connection at a time, and only while no live worker has fewer
open connections than it has. The workers read each other's counts on a small board they share
(``Board``: one slot per worker, its pid and its open connections, in a file the parent made). A
worker that is not among the least loaded stops watching the socket for ``PAUSE_S`` and looks
again. A connection never waits on a stuck worker: once one has been left waiting for
``PATIENCE_S`` (the least loaded worker's event loop held up, or the worker stopped), the next
worker that looks takes it.

uvicorn has no hook for how its workers accept, so ``balanced`` wraps the event loop it creates:
``create_server`` on a listening socket starts an ``Acceptor`` instead of the loop's own accept
loop, and hands each accepted socket to uvicorn's protocol (``connect_accepted_socket``).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import mmap
import os
import socket
import ssl as ssl_
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from clip_gateway.backend import shm

log = logging.getLogger(__name__)

#: A worker that is not the least loaded looks again after this long.
PAUSE_S = 0.002
#: A connection left waiting this long for the least loaded worker goes to the next that looks.
PATIENCE_S = 0.05

_SLOT = 16  # two int64: a pid and its open connections (the header: workers planned, 0)


class Board:
    """Each worker's open connections, in a file every worker maps: after a header (the
    workers planned), one slot per worker (its pid, its count). A worker writes only its own
    slot; a slot whose process is gone is free again."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("r+b")
        self._map = mmap.mmap(self._file.fileno(), 0)
        self._words = memoryview(self._map).cast("q")  # planned, 0, then pid, count, ...
        self.mine: int | None = None

    @staticmethod
    def create(path: Path, workers: int) -> None:
        """A board for ``workers`` workers, with room for as many again (a restarted worker's
        predecessor may not be reaped yet when it claims a slot)."""
        path.write_bytes(struct.pack("=qq", workers, 0) + bytes(_SLOT * 2 * max(1, workers)))

    @property
    def _slots(self) -> range:
        return range(1, len(self._words) // 2)

    def claim(self, pid: int | None = None) -> None:
        """This process's slot (``pid``: another's, for tests): one never claimed, or whose
        process is gone."""
        pid = os.getpid() if pid is None else pid
        words = self._words
        with _locked(self._file.fileno()):
            for slot in self._slots:
                if not _alive(words[2 * slot]):
                    words[2 * slot + 1] = 0
                    words[2 * slot] = pid
                    self.mine = slot
                    return
        raise RuntimeError("no free slot on the connection board")

    def publish(self, count: int) -> None:
        if self.mine is not None:
            self._words[2 * self.mine + 1] = count

    def fewer_elsewhere(self, count: int) -> bool:
        """Whether a live worker other than this one has fewer open connections than
        ``count``."""
        words = self._words
        return any(
            slot != self.mine and words[2 * slot + 1] < count and _alive(words[2 * slot])
            for slot in self._slots
        )

    def accepting(self) -> tuple[int, int]:
        """Workers accepting connections (a live slot), and those planned."""
        words = self._words
        return sum(_alive(words[2 * slot]) for slot in self._slots), words[0]

    def release(self) -> None:
        if self.mine is not None:
            self._words[2 * self.mine] = 0
            self.mine = None

    def close(self) -> None:
        self.release()
        self._words.release()
        self._map.close()
        self._file.close()


class Acceptor:
    """One worker's accepting on the shared listening socket (the module's docstring)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        protocol_factory: Callable[[], asyncio.BaseProtocol],
        board: Board,
        ssl: ssl_.SSLContext | None = None,
    ) -> None:
        self._loop = loop
        # its own descriptor, its family read from it (uvicorn wraps an inherited one as
        # AF_UNIX, whatever it is)
        self.sock = socket.socket(fileno=os.dup(sock.fileno()))
        self.sock.setblocking(False)
        self._factory = protocol_factory
        self._board = board
        self._ssl = ssl
        #: Open connections (accepted, not yet lost): what the board shows of this worker.
        self.connections = 0
        self._connecting: set[asyncio.Task[None]] = set()
        #: When this worker first left a waiting connection to a less loaded one, and last did.
        self._left_since: float | None = None
        self._left_at = 0.0
        self._later: asyncio.TimerHandle | None = None
        self._watching = False
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def start(self) -> None:
        self._board.claim()
        self._watch()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._unwatch()
        if self._later is not None:
            self._later.cancel()
        self.sock.close()
        self._board.close()

    def _watch(self) -> None:
        self._later = None
        if not self._closed and not self._watching:
            self._loop.add_reader(self.sock.fileno(), self._ready)
            self._watching = True

    def _unwatch(self) -> None:
        if self._watching:
            self._loop.remove_reader(self.sock.fileno())
            self._watching = False

    def _pause(self, seconds: float) -> None:
        self._unwatch()
        self._later = self._loop.call_later(seconds, self._watch)

    def _counted(self, change: int) -> None:
        self.connections += change
        if not self._closed:
            self._board.publish(self.connections)

    def _ready(self) -> None:
        """The socket has a connection waiting: take it, or leave it to a less loaded worker."""
        count = self.connections
        now = self._loop.time()
        if self._board.fewer_elsewhere(count):
            if self._left_since is None or now - self._left_at > 3 * PAUSE_S:
                self._left_since = now  # not the same wait: it was taken meanwhile
            self._left_at = now
            if now - self._left_since < PATIENCE_S:
                self._pause(PAUSE_S)
                return
        self._left_since = None
        try:
            conn, _ = self.sock.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return  # another worker took it
        except OSError as exc:  # out of descriptors or buffers: as asyncio does, a pause
            log.error("accepting a connection: %s; accepting again in 1 s", exc)
            self._pause(1.0)
            return
        conn.setblocking(False)
        self._counted(+1)
        task = self._loop.create_task(self._connect(conn))
        self._connecting.add(task)
        task.add_done_callback(self._connecting.discard)

    async def _connect(self, conn: socket.socket) -> None:
        made = False

        def counting() -> asyncio.BaseProtocol:
            """The server's protocol for this connection, which counts itself out when lost."""
            nonlocal made
            made = True
            protocol = self._factory()
            lost = protocol.connection_lost

            def connection_lost(exc: Exception | None) -> None:
                try:
                    lost(exc)
                finally:
                    self._counted(-1)

            protocol.connection_lost = connection_lost  # type: ignore[method-assign]
            return protocol

        try:
            await self._loop.connect_accepted_socket(counting, conn, ssl=self._ssl)
        except Exception as exc:  # the client left during a TLS handshake, or similar
            log.debug("a connection closed before it was served: %s", exc)
            conn.close()
            if not made:
                self._counted(-1)


class _Serving:
    """What uvicorn keeps of a server: it closes it, then waits for it."""

    def __init__(self, acceptor: Acceptor) -> None:
        self._acceptor = acceptor
        self.sockets = (acceptor.sock,)

    def close(self) -> None:
        self._acceptor.close()

    def is_serving(self) -> bool:
        return not self._acceptor.closed

    async def wait_closed(self) -> None:
        return None


def balanced(
    loop_factory: Callable[[], asyncio.AbstractEventLoop], board: Path
) -> Callable[[], asyncio.AbstractEventLoop]:
    """``loop_factory``'s loops, on which ``create_server`` over a listening socket accepts
    through an ``Acceptor`` on ``board``."""

    def make() -> asyncio.AbstractEventLoop:
        loop = loop_factory()
        serve = loop.create_server

        async def create_server(
            protocol_factory: Callable[[], asyncio.BaseProtocol],
            host: Any = None,
            port: Any = None,
            *,
            sock: socket.socket | None = None,
            ssl: ssl_.SSLContext | None = None,
            **kwargs: Any,
        ) -> Any:
            if sock is None:
                return await serve(protocol_factory, host, port, ssl=ssl, **kwargs)
            acceptor = Acceptor(loop, sock, protocol_factory, Board(board), ssl)
            acceptor.start()
            return _Serving(acceptor)

        loop.create_server = create_server  # type: ignore[method-assign,assignment]
        return loop

    return make


def _alive(pid: int) -> bool:
    return pid > 0 and shm.alive(pid)  # 0: a free slot (kill(0) would signal our own group)


@contextlib.contextmanager
def _locked(fd: int) -> Iterator[None]:
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
