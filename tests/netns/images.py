"""The image server the namespace tests fetch from (127.0.0.1, allowlisted), with each
behaviour an attacker's or a broken server would have, and what it saw: every path asked for,
and how many connections it is holding open at once (the fetches in flight, seen from the
server), at most."""

from __future__ import annotations

import contextlib
import select
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from clip_gateway.config.processes import GatewayProcess
from tests import samples
from tests.netns.gateway import TOKENIZER, FakeGateway

#: The longest the server holds a connection it does not answer.
HOLD_S = 30.0
#: What ``/part`` sends before it stalls.
PART_BYTES = 3 << 19


class Handler(BaseHTTPRequestHandler):
    """``/img/N`` a JPEG; ``/stall`` never answers (until the client leaves); ``/forever`` an
    endless body; ``/part`` 1.5 MiB of a body, then nothing; ``/slow-img?S`` a JPEG after S
    seconds; ``/loc?HEX`` a 302 whose Location is those bytes, as they are; ``/404``."""

    server: Images

    def do_GET(self) -> None:
        self.server.saw(self.path)
        path, _, query = self.path.partition("?")
        if path.startswith("/img/") and path[5:].isdigit():
            self._send(200, samples.compact(int(path[5:])))
        elif path == "/stall":
            self._hold()
        elif path == "/forever":
            self._stream(1 << 40)
        elif path == "/part":
            self._stream(PART_BYTES)
            self._hold()
        elif path == "/slow-img":
            time.sleep(float(query))
            self._send(200, samples.compact(1))
            self.server.saw("sent " + self.path)
        elif path == "/loc":
            location = bytes.fromhex(query)
            with contextlib.suppress(OSError):
                self.wfile.write(b"HTTP/1.1 302 Found\r\nLocation: " + location +
                                 b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")  # fmt: skip
        else:
            self._send(404, b"nope")

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "image/jpeg")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(OSError):  # the fetcher may hang up first
            self.wfile.write(body)

    def _stream(self, size: int) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "image/jpeg")
        self.end_headers()
        chunk = b"\xff" * 65536
        with contextlib.suppress(OSError):
            for _ in range(size // len(chunk)):
                self.wfile.write(chunk)
            self.wfile.flush()

    def _hold(self) -> None:
        """Answer nothing until the client hangs up (or ``HOLD_S``), counted as held."""
        with self.server.holding():
            ends = time.monotonic() + HOLD_S
            while time.monotonic() < ends:
                readable, _, _ = select.select([self.connection], [], [], 0.02)
                if readable:  # the client hung up: nothing else comes on a GET's connection
                    return

    def log_message(self, *args: Any) -> None:
        pass


class Images(ThreadingHTTPServer):
    request_queue_size = 1024  # hundreds of fetches may connect at once (what main did)
    daemon_threads = True
    block_on_close = False

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self._lock = threading.Lock()
        self.paths: list[str] = []
        self.held = 0
        self.peak_held = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def saw(self, path: str) -> None:
        with self._lock:
            self.paths.append(path)

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        with self._lock:
            self.held += 1
            self.peak_held = max(self.peak_held, self.held)
        try:
            yield
        finally:
            with self._lock:
                self.held -= 1

    def reset(self) -> None:
        with self._lock:
            self.paths.clear()
            self.peak_held = self.held

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a fetcher that hangs up mid-answer is what several tests do


@contextlib.contextmanager
def serving() -> Iterator[Images]:
    server = Images()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def gateway(log_dir: Any, tokenizer: str | None = None, **env: str) -> Iterator[GatewayProcess]:
    """A gateway process (the fake model) with URL items on, 127.0.0.1 allowed, and ``env``."""
    settings = {
        "GATEWAY_URL_INPUTS": "true",
        "GATEWAY_URL_ALLOW": "127.0.0.1/32",
        "GATEWAY_CANARY_INTERVAL_S": "0",
        "GATEWAY_DECODE_THREADS": "2",
        "GATEWAY_ADMISSION_INFER_S_PER_IMAGE": "0.001",  # a GPU's price: admission lets much in
        **({TOKENIZER: tokenizer} if tokenizer else {}),
        **env,
    }
    with FakeGateway("127.0.0.1:1", env=settings, log_path=log_dir / "gateway.log") as process:
        yield process
