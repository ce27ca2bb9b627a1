"""Upload vs URL item vs cache hit: batches of 32 compact JPEGs through the real stack (export,
Triton ``cpu`` profile, the gateway with URL items and the cache on), the URLs served by an
image server on loopback (allowlisted). Run it where nothing can leave the machine:

    unshare -n -- sh -c 'ip link set lo up && .venv/bin/python -m bench url-cache'

It refuses to run in a network namespace with more than loopback unless ``--anywhere``.
Writes ``bench/results/url_cache/url_cache.{json,md}``.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.harness.output import write_results
from bench.harness.photos import compact_jpeg
from bench.harness.stack import running

BATCH = 32
OUT = Path(__file__).parents[1] / "results" / "url_cache"


def _server(images: dict[str, bytes]) -> tuple[ThreadingHTTPServer, str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = images.get(self.path.lstrip("/"), b"")
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", "image/jpeg")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    class Server(ThreadingHTTPServer):
        request_queue_size = 128
        daemon_threads = True

    httpd = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


def _vectors(response: httpx.Response) -> np.ndarray:
    response.raise_for_status()
    rows, dim = map(int, response.headers["x-embedding-shape"].split(","))
    return np.frombuffer(response.content, "<f4").reshape(rows, dim).copy()


def _timed(send: Any) -> tuple[float, np.ndarray]:
    started = time.perf_counter()
    vectors = _vectors(send())
    return time.perf_counter() - started, vectors


def _metric(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{{want}}}"):
            return float(line.split()[-1])
    return 0.0


def run(rounds: int) -> dict[str, Any]:
    seeds = {mode: [[5000 + r * 1000 + m * 100 + i for i in range(BATCH)] for r in range(rounds)]
             for m, mode in enumerate(("upload", "url"))}  # fmt: skip
    seeds["warm-up"] = [[4000 + i for i in range(BATCH)]]
    images = {f"{s}.jpg": compact_jpeg(s) for batches in seeds.values() for b in batches for s in b}
    httpd, base = _server(images)
    env = {"GATEWAY_URL_INPUTS": "true", "GATEWAY_URL_ALLOW": "127.0.0.1/32",
           "GATEWAY_CACHE_MIB": "64", "GATEWAY_CANARY_INTERVAL_S": "0"}  # fmt: skip
    binary = {"Accept": "application/octet-stream"}
    times: dict[str, list[float]] = {"upload": [], "url": [], "cache hit": []}
    try:
        with running(env) as stack, httpx.Client(base_url=stack.gateway.url, timeout=120) as http:

            def upload(batch: list[int]) -> httpx.Response:
                files = [("image", (f"{s}.jpg", images[f"{s}.jpg"], "image/jpeg")) for s in batch]
                return http.post("/v1/embeddings", files=files, headers=binary)

            def by_url(batch: list[int]) -> httpx.Response:
                items = [{"image": f"{base}/{s}.jpg"} for s in batch]
                return http.post("/v1/embeddings", json={"input": items}, headers=binary)

            _timed(lambda: upload(seeds["warm-up"][0]))  # Triton's first call (not counted)
            first: list[np.ndarray] = []
            for r in range(rounds):
                spent, vectors = _timed(lambda r=r: upload(seeds["upload"][r]))
                times["upload"].append(spent)
                first.append(vectors)
                times["url"].append(_timed(lambda r=r: by_url(seeds["url"][r]))[0])
            before = http.get("/metrics").text
            identical = True
            for r in range(rounds):
                spent, vectors = _timed(lambda r=r: upload(seeds["upload"][r]))
                times["cache hit"].append(spent)
                identical &= bool(np.array_equal(vectors, first[r]))
            after = http.get("/metrics").text
    finally:
        httpd.shutdown()
    decodes = [_metric(t, "gateway_images_total", format="jpeg") for t in (before, after)]
    hits = _metric(after, "gateway_cache_lookups_total", kind="image", outcome="hit")
    return {
        "batch": BATCH,
        "rounds": rounds,
        "median_s": {mode: statistics.median(ts) for mode, ts in times.items()},
        "times_s": times,
        "cache_hits": hits,
        "decodes_during_hits": decodes[1] - decodes[0],
        "hit_vectors_identical": identical,
        "machine": {"cpus": len(__import__("os").sched_getaffinity(0))},
    }


def markdown(results: dict[str, Any]) -> str:
    batch, medians = results["batch"], results["median_s"]
    rows = [
        f"| {mode} | {medians[mode] * 1000:,.1f} | {batch / medians[mode]:,.1f} |"
        for mode in ("upload", "url", "cache hit")
    ]
    return "\n".join(
        [
            f"Batches of {batch} compact JPEGs (256 px), ViT-B/32 on Triton's `cpu` profile, "
            f"{results['rounds']} rounds each, median; {results['machine']['cpus']} CPUs.",
            "",
            "| path | ms per batch | images/s |",
            "| --- | ---: | ---: |",
            *rows,
            "",
            f"Cache hits: {results['cache_hits']:.0f}; images decoded while answering them: "
            f"{results['decodes_during_hits']:.0f}; hit vectors identical to the first answers: "
            f"{results['hit_vectors_identical']}. Upload and URL rounds use distinct images "
            "(no hits); the cache-hit rounds re-send the upload rounds' batches.",
            "",
        ]
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench url-cache", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--anywhere", action="store_true", help="run outside a sealed namespace")
    args = parser.parse_args(argv)
    interfaces = [name for _, name in socket.if_nameindex()]
    if interfaces != ["lo"] and not args.anywhere:
        print(f"not in a loopback-only namespace ({interfaces}); see the docstring",
              file=sys.stderr)  # fmt: skip
        return 2
    results = run(args.rounds)
    write_results(args.out, "url_cache", results, markdown=markdown(results))
    print(markdown(results))
    return 0
