"""The figures of docs/RELIABILITY.md for Immich's reverse proxy (issue 43), with the gateway's
default clocks: the real gateway process, the byte-level upstream of tests/netns/raw_upstream.py
and raw-socket clients. Run it where nothing can leave loopback:

    unshare -n -m -- sh -c 'ip link set lo up && exec .venv/bin/python -m tests.netns.measure_proxy'

It prints one line per figure (about two minutes; the slow body and the unread answers wait
for the default 30 s clocks). Not a test: nothing here is asserted."""

from __future__ import annotations

import json
import socket
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from clip_gateway.config.processes import GatewayProcess
from tests.netns.raw_upstream import RawUpstream
from tests.netns.test_immich_proxy import SWITCHES, form, head, read_until_closed, rss_mb


def in_flight(gateway: GatewayProcess) -> int:
    return int(httpx.get(f"{gateway.url}/immich/upstream", timeout=60).json()["forwards_in_flight"])


def slow_body(gateway: GatewayProcess) -> str:
    """A 2 MiB body sent at 10 KiB/s (just above the 8 KiB/s minimum pace)."""
    body = form("ok", "slow", text=b"x" * (2 << 20))
    stop = threading.Event()
    with socket.create_connection((gateway.host, gateway.port)) as sock:
        start = time.monotonic()
        sock.sendall(head(len(body)))

        def trickle() -> None:
            for at in range(0, len(body), 1024):
                if stop.wait(0.1):
                    return
                try:
                    sock.sendall(body[at : at + 1024])
                except OSError:
                    return

        sender = threading.Thread(target=trickle)
        sender.start()
        sock.settimeout(600)
        status = sock.recv(200).partition(b"\r\n")[0].decode()
        took = time.monotonic() - start
        stop.set()
        sender.join()
    return f"slow body (10 KiB/s): {status} after {took:.1f} s"


def departed(gateway: GatewayProcess, upstream: RawUpstream) -> str:
    """A client that leaves while the upstream works on its request."""
    body = form("slow", "departed")
    with socket.create_connection((gateway.host, gateway.port)) as sock:
        sock.sendall(head(len(body)) + body)
        while upstream.closed_after("departed") is None:
            time.sleep(0.01)
        left = time.monotonic()
    connection = upstream.closed_after("departed")
    assert connection is not None
    while connection.closed is None and time.monotonic() - left < 300:
        time.sleep(0.005)
    closed = (connection.closed or time.monotonic()) - left
    while in_flight(gateway) and time.monotonic() - left < 300:
        time.sleep(0.005)
    return (
        f"departed client: upstream connection closed {closed * 1000:.0f} ms after it left, "
        f"slot free after {(time.monotonic() - left) * 1000:.0f} ms"
    )


def unread(gateway: GatewayProcess, clients: int = 12, wait_s: float = 35.0) -> str:
    """Clients asking for a 15 MiB answer and never reading it."""
    assert gateway.process is not None
    pid = gateway.process.pid
    before = rss_mb(pid)
    sockets = []
    for n in range(clients):
        sock = socket.create_connection((gateway.host, gateway.port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        body = form("big", f"unread-{n}")
        sock.sendall(head(len(body)) + body)
        sockets.append(sock)
    for sock in sockets:
        sock.settimeout(120)
        sock.recv(12)
    time.sleep(1)
    held, during = in_flight(gateway), rss_mb(pid)
    start = time.monotonic()
    while in_flight(gateway) and time.monotonic() - start < wait_s:
        time.sleep(0.1)
    freed = time.monotonic() - start
    time.sleep(max(0.0, wait_s - freed))
    after, left = rss_mb(pid), in_flight(gateway)
    for sock in sockets:
        sock.close()
    return (
        f"{clients} unread 15 MiB answers: RSS {before:.0f} MB before, {during:.0f} MB held "
        f"({held} slots), {after:.0f} MB {wait_s:.0f} s later ({left} slots; slots freed "
        f"{freed:.1f} s after the answers stalled)"
    )


def switches(gateway: GatewayProcess, count: int = 50, limit_s: float = 30.0) -> str:
    results: list[tuple[bytes, float | None]] = [(b"", None)] * count
    sockets = [socket.create_connection((gateway.host, gateway.port)) for _ in range(count)]

    def attempt(n: int) -> None:
        start = time.monotonic()
        sockets[n].sendall(SWITCHES[n % len(SWITCHES)])
        sockets[n].settimeout(limit_s)
        try:
            first = sockets[n].recv(64)
        except TimeoutError:
            return
        answered = time.monotonic() - start
        _, closed = read_until_closed(sockets[n], limit_s)
        results[n] = (first, answered if closed is not None else None)

    threads = [threading.Thread(target=attempt, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for sock in sockets:
        sock.close()
    done = [t for _, t in results if t is not None]
    statuses = sorted({first.split(b"\r\n")[0].decode() for first, _ in results if first})
    return (
        f"{count} protocol switches held open: {len(done)} answered and closed within "
        f"{limit_s:g} s (slowest {max(done, default=0) * 1000:.0f} ms); statuses {statuses}"
    )


def status_calls(gateway: GatewayProcess, upstream: RawUpstream) -> str:
    upstream.ping_s = 1.0
    before = upstream.pings
    with ThreadPoolExecutor(12) as pool:
        states = list(pool.map(
            lambda _: httpx.get(f"{gateway.url}/immich/upstream", timeout=60).json(),
            range(12)))  # fmt: skip
    upstream.ping_s = 0.0
    ups = sum(s["upstreams"][0]["state"] == "up" for s in states)
    return f"12 concurrent status calls, 1 s /ping: {ups} say up, {upstream.pings - before} pings"


def latency(gateway: GatewayProcess, count: int = 300) -> str:
    times = []
    with httpx.Client(timeout=60) as client:
        for n in range(count):
            start = time.perf_counter()
            client.post(f"{gateway.url}/predict", content=form("ok", f"l{n}"),
                        headers={"content-type": "multipart/form-data; boundary=b0"})  # fmt: skip
            times.append(time.perf_counter() - start)
    times.sort()
    return (
        f"{count} small forwards in turn: median {statistics.median(times) * 1000:.2f} ms, "
        f"p95 {times[int(0.95 * count)] * 1000:.2f} ms"
    )


def main() -> None:
    with RawUpstream(hold_s=120).running() as upstream, tempfile.TemporaryDirectory() as tmp:
        env = {
            "GATEWAY_IMMICH": "true",
            "GATEWAY_IMMICH_UPSTREAM": upstream.url,
            "GATEWAY_CANARY_INTERVAL_S": "0",
            "GATEWAY_DECODE_THREADS": "1",
            "GATEWAY_MAX_BODY_BYTES": str(8 << 20),
        }
        with GatewayProcess("127.0.0.1:1", env=env, log_path=Path(tmp) / "gw.log") as gateway:
            print(latency(gateway), flush=True)
            print(status_calls(gateway, upstream), flush=True)
            print(switches(gateway), flush=True)
            print(departed(gateway, upstream), flush=True)
            print(unread(gateway), flush=True)
            print(slow_body(gateway), flush=True)
            print(json.dumps({"log_errors": (Path(tmp) / "gw.log").read_text().count('"ERROR"')}))


if __name__ == "__main__":
    main()
