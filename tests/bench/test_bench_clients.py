"""The bench's one-off requests (bench/harness/clients.py ``post``) are sent as the SDK sends
them: a 429 waited out as its Retry-After says, then sent again (issue 42: ``python -m bench host
--smoke``'s parity request of 16 PNGs got 429 beside other work, and the rehearsal failed); so
are a load client's when its study measures something else (``GatewayClient(retries=...)``,
``bench cost``), while an overload's load client counts them."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from bench.harness.clients import Batches, GatewayClient, post
from clip_gateway.client.core import Retries


class Busy(BaseHTTPRequestHandler):
    """429 with Retry-After: 1 to the first request, 200 after; every arrival's time kept."""

    arrivals: ClassVar[list[float]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.arrivals.append(time.monotonic())
        first = len(self.arrivals) == 1
        self.send_response(429 if first else 200)
        if first:
            self.send_header("Retry-After", "1")
        self.send_header("X-Embedding-Shape", "1,4")  # one row of four float32
        self.send_header("Content-Length", "16")
        self.end_headers()
        self.wfile.write(bytes(16))

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    Busy.arrivals = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Busy)
    thread = threading.Thread(target=httpd.serve_forever)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def test_a_one_off_request_is_sent_again_after_the_retry_after(server: str) -> None:
    response = post(f"{server}/v1/embeddings", json={"input": ["a"]}, timeout=10)
    assert response.status_code == 200
    first, second = Busy.arrivals
    assert second - first >= 1.0  # not sooner than the server asked


@pytest.mark.parametrize("retries", [None, Retries()], ids=["counted", "waited-out"])
def test_a_load_client_counts_a_429_or_waits_it_out(server: str, retries: Retries | None) -> None:
    async def one() -> int:
        client = GatewayClient(server, Batches([[b"jpeg"]]), retries=retries)
        try:
            return (await client(0)).status
        finally:
            await client.close()

    assert asyncio.run(one()) == (429 if retries is None else 200)
    assert len(Busy.arrivals) == (1 if retries is None else 2)
