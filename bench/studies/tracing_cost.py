"""``python -m bench tracing``: what OpenTelemetry costs, off vs on at 0% and 100% sampling.

Triton runs the null model (so the gateway's own cost is what is measured) with OpenTelemetry
tracing configured as in production; spans go to a throwaway OTLP/HTTP receiver on loopback.
``--survival SECONDS``: does Triton live through traced load, per GATEWAY_TRITON_SPANS setting.
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench.harness import load, models, study
from bench.harness.clients import Batches, GatewayClient
from bench.harness.output import write_results
from bench.harness.photos import compact_jpeg
from clip_gateway.config.processes import GatewayProcess
from clip_gateway.launcher.local import LocalTriton, otel_trace_args

MODES = {
    "off": {"GATEWAY_TRACING": "off"},
    "on, 0% sampled": {"GATEWAY_TRACE_SAMPLE_RATIO": "0"},
    "on, 100% sampled": {"GATEWAY_TRACE_SAMPLE_RATIO": "1"},
}


class _Sink(BaseHTTPRequestHandler):
    received = 0

    def do_POST(self) -> None:
        _Sink.received += len(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _sink() -> tuple[ThreadingHTTPServer, str]:
    sink = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    return sink, f"http://127.0.0.1:{sink.server_address[1]}"


def _env(endpoint: str, **more: str) -> dict[str, str]:
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "GATEWAY_CANARY_INTERVAL_S": "0",
            "GATEWAY_DECODE_THREADS": "2", **more}  # fmt: skip


def run(minutes: float, out: Path, smoke: bool = False) -> dict[str, Any]:
    # The machine's noise (client, gateway and Triton share the cores) is as large as the effect,
    # so each mode is measured in several rounds, in a rotated order, and the median is reported.
    rounds = 1 if smoke else 3
    seconds = 3.0 if smoke else max(minutes * 60 / (2 * len(MODES) * rounds), 5.0)
    (sink, endpoint), pool, names = _sink(), [compact_jpeg(i) for i in range(32)], list(MODES)
    measured: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="bench-tracing-") as tmp:
        work = Path(tmp)
        repo = models.null_repository(models.export(), work / "repo")
        trace_args = otel_trace_args(f"{endpoint}/v1/traces")
        with LocalTriton(repo, log_path=work / "triton.log", extra_args=trace_args) as triton:
            for round_ in range(rounds):
                for mode in names[round_ % len(names) :] + names[: round_ % len(names)]:
                    log = work / "gw.log"
                    env = _env(endpoint, **MODES[mode])
                    with GatewayProcess(triton.grpc_url, env=env, log_path=log) as gw:
                        gw.wait_ready()
                        point = asyncio.run(_measure(gw.url, pool, seconds))
                    _require_answers(mode, point, log)
                    measured[mode].append(point)
    sink.shutdown()
    results: dict[str, Any] = {"seconds_per_point": seconds, "rounds": rounds, "modes": {}}
    for mode, runs in measured.items():
        results["modes"][mode] = row = {}
        for key in ("single", "batch_8"):
            median = sorted(runs, key=lambda r: r[key]["images_per_s"])[len(runs) // 2][key]
            row[key] = {**median, "rounds_images_per_s": [r[key]["images_per_s"] for r in runs]}
    base = results["modes"]["off"]
    for row in results["modes"].values():
        for key in ("single", "batch_8"):
            row[key]["throughput_vs_off"] = round(
                row[key]["images_per_s"] / base[key]["images_per_s"] - 1, 4
            )
    results["span_bytes_received"] = _Sink.received
    write_results(out, "tracing", results, markdown=markdown(results))
    return results


def survival(seconds: float, out: Path) -> int:
    """Every request sampled, 16 single-image clients, a fresh Triton per setting: ``on`` sends
    Triton the trace context, ``auto`` not to one before 2.57 (docs/OBSERVABILITY.md)."""
    (sink, endpoint), results = _sink(), {}
    rows = [f"# Triton under {seconds:.0f} s of traced load (bench tracing --survival)", "",
            "| GATEWAY_TRITON_SPANS | requests | statuses | Triton at the end | segfault |",
            "| --- | --- | --- | --- | --- |"]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-tracing-") as tmp:
        repo = models.null_repository(models.export(), Path(tmp) / "repo")
        pool, args = [compact_jpeg(i) for i in range(32)], otel_trace_args(f"{endpoint}/v1/traces")
        for setting in ("on", "auto"):
            log = Path(tmp) / f"triton-{setting}.log"
            env = _env(endpoint, GATEWAY_TRACE_SAMPLE_RATIO="1", GATEWAY_TRITON_SPANS=setting)
            with LocalTriton(repo, log_path=log, extra_args=args) as triton:
                with GatewayProcess(triton.grpc_url, env=env, log_path=Path(tmp) / "gw") as gw:
                    gw.wait_ready()
                    point = asyncio.run(_point(gw.url, pool, 1, 16, seconds))
                code = triton.process.poll() if triton.process else None
            ended = "running" if code is None else f"exited {code}"
            segfault = "Signal (11)" in log.read_text(errors="replace")
            results[setting] = {**point, "triton": ended, "segfault_in_log": segfault}
            rows.append(f"| {setting} | {point['requests']} | {point['statuses']} | {ended} | "
                        f"{'yes' if segfault else 'no'} |")  # fmt: skip
    sink.shutdown()
    write_results(out, "survival", results, markdown="\n".join(rows) + "\n")
    return study.checked(out, {})


async def _measure(url: str, pool: list[bytes], seconds: float) -> dict[str, Any]:
    return {key: await _point(url, pool, batch, clients, seconds)
            for key, batch, clients in (("single", 1, 8), ("batch_8", 8, 4))}  # fmt: skip


async def _point(url: str, pool: list[bytes], batch: int, clients: int, seconds: float) -> Any:
    batches = Batches(
        [[pool[(i * batch + j) % len(pool)] for j in range(batch)] for i in range(16)]
    )
    client = GatewayClient(url, batches)
    try:
        await load.closed_loop(client, clients, count=clients * 4)  # warm
        return load.summarize(await load.closed_loop(client, clients, duration=seconds))
    finally:
        await client.close()


def _require_answers(mode: str, point: dict[str, Any], log: Path) -> None:
    """A point with no answered request has no latency to report: stop with what the
    requests got and what the gateway said, rather than a table of nothing."""
    failed = {key: row["statuses"] for key, row in point.items() if not row["ok"]}
    if failed:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        raise RuntimeError(
            f"tracing {mode!r}: no request was answered in {sorted(failed)} "
            f"(statuses {failed}; 599: the connection failed); the gateway's log ends:\n{tail}"
        )


def markdown(results: dict[str, Any]) -> str:
    rows = ["# Tracing cost (null model: the gateway's own work)", "",
            f"Median of {results['rounds']} rounds (modes in rotated order) of "
            f"{results['seconds_per_point']:.0f} s per point, each round's img/s in brackets; "
            "spans exported over OTLP/HTTP to a loopback receiver; Triton traced at rate 0 (i.e. "
            "exactly the sampled requests).", "",
            "| tracing | single-image img/s | p50 ms | vs off | 8-image img/s | p50 ms | vs off |",
            "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for mode, row in results["modes"].items():
        s, b = row["single"], row["batch_8"]
        rows.append(
            f"| {mode} | {s['images_per_s']} ({_spread(s)}) | {s['latency_ms']['p50']} | "
            f"{s['throughput_vs_off']:+.1%} | {b['images_per_s']} ({_spread(b)}) | "
            f"{b['latency_ms']['p50']} | {b['throughput_vs_off']:+.1%} |"
        )
    return "\n".join(rows) + "\n"


def _spread(row: dict[str, Any]) -> str:
    return ", ".join(f"{v:.0f}" for v in row["rounds_images_per_s"])


def main(argv: list[str]) -> int:
    parser = study.parser("tracing", __doc__, smoke="seconds, for CI")
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--survival", type=float, metavar="SECONDS")
    args = parser.parse_args(argv)
    out = study.out(args, "tracing")
    if args.survival:
        return survival(args.survival, out)
    return study.checked(out, run(args.minutes, out, args.smoke))
