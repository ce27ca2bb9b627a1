"""``python -m bench tracing``: what OpenTelemetry costs, off vs on at 0% and 100% sampling.

Triton runs the null model (so the gateway's own cost is what is measured) with OpenTelemetry
tracing configured as in production; spans go to a throwaway OTLP/HTTP receiver on loopback.

``--survival SECONDS`` instead asks whether Triton lives through traced load: every request
sampled, 16 single-image clients, once with ``GATEWAY_TRITON_SPANS=on`` (the trace context sent
to Triton, which then traces each request) and once as configured by default (``auto``: none
sent to a Triton before 2.57, whose tracer crashes, triton-inference-server/server#7795).
"""

from __future__ import annotations

import asyncio
import collections
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
    "on, 0% sampled": {"OTEL_TRACES_SAMPLER": "always_off"},
    "on, 100% sampled": {"OTEL_TRACES_SAMPLER": "always_on"},
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


def run(minutes: float, out: Path, smoke: bool = False) -> dict[str, Any]:
    # The machine's noise (client, gateway and Triton share the cores) is as large as the effect,
    # so each mode is measured in several rounds, in a rotated order, and the median is reported.
    rounds = 1 if smoke else 3
    seconds = 3.0 if smoke else max(minutes * 60 / (2 * len(MODES) * rounds), 5.0)
    sink, endpoint = _sink()
    exported = models.export()
    pool = [compact_jpeg(i) for i in range(32)]
    measured: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="bench-tracing-") as tmp:
        work = Path(tmp)
        repo = models.null_repository(exported, work / "repo")
        trace_args = otel_trace_args(f"{endpoint}/v1/traces")
        with LocalTriton(repo, log_path=work / "triton.log", extra_args=trace_args) as triton:
            for round_ in range(rounds):
                order = list(MODES)
                order = order[round_ % len(order) :] + order[: round_ % len(order)]
                for mode in order:
                    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
                           "GATEWAY_CANARY_INTERVAL_S": "0", "GATEWAY_DECODE_THREADS": "2",
                           **MODES[mode]}  # fmt: skip
                    log = work / "gw.log"
                    with GatewayProcess(triton.grpc_url, env=env, log_path=log) as gw:
                        gw.wait_ready()
                        point = asyncio.run(_measure(gw.url, pool, seconds))
                    _require_answers(mode, point, log)
                    measured[mode].append(point)
    sink.shutdown()
    results: dict[str, Any] = {"seconds_per_point": seconds, "rounds": rounds, "modes": {}}
    for mode, runs in measured.items():
        row: dict[str, Any] = {}
        for key in ("single", "batch_8"):
            ranked = sorted(runs, key=lambda r: r[key]["images_per_s"])
            row[key] = {
                **ranked[len(ranked) // 2][key],
                "rounds_images_per_s": [r[key]["images_per_s"] for r in runs],
            }
        results["modes"][mode] = row
    base = results["modes"]["off"]
    for row in results["modes"].values():
        for key in ("single", "batch_8"):
            row[key]["throughput_vs_off"] = round(
                row[key]["images_per_s"] / base[key]["images_per_s"] - 1, 4
            )
    results["span_bytes_received"] = _Sink.received
    write_results(out, "tracing", results, markdown=markdown(results))
    return results


#: The load that crashed Triton 2.51's tracer here (7,224 requests in, on the 2-core machine).
SURVIVAL_CLIENTS = 16


def survival(seconds: float, out: Path) -> dict[str, Any]:
    """Each setting of GATEWAY_TRITON_SPANS under the same traced load, on a fresh Triton."""
    sink, endpoint = _sink()
    exported = models.export()
    batches = Batches([[compact_jpeg(i)] for i in range(32)])
    results: dict[str, Any] = {"seconds": seconds, "clients": SURVIVAL_CLIENTS, "runs": {}}
    with tempfile.TemporaryDirectory(prefix="bench-tracing-survival-") as tmp:
        work = Path(tmp)
        repo = models.null_repository(exported, work / "repo")
        for setting in ("on", "auto"):
            log = work / f"triton-{setting}.log"
            trace_args = otel_trace_args(f"{endpoint}/v1/traces")
            env = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_TRACES_SAMPLER": "always_on",
                   "GATEWAY_TRITON_SPANS": setting, "GATEWAY_CANARY_INTERVAL_S": "0",
                   "GATEWAY_DECODE_THREADS": "2"}  # fmt: skip
            with LocalTriton(repo, log_path=log, extra_args=trace_args) as triton:
                with GatewayProcess(triton.grpc_url, env=env, log_path=work / "gw.log") as gw:
                    gw.wait_ready()
                    records = asyncio.run(_load(gw.url, batches, seconds))
                exit_code = triton.process.poll() if triton.process else None
            text = log.read_text(errors="replace")
            ok = [r for r in records if r.reply.status == 200]
            results["runs"][setting] = {
                "requests": len(records),
                "ok": len(ok),
                "statuses": dict(
                    sorted(collections.Counter(str(r.reply.status) for r in records).items())
                ),
                "answered_for_s": round(max((r.start + r.latency for r in ok), default=0.0), 1),
                "triton_exit_code": exit_code,  # None: still running when the load ended
                "segfault_in_log": "Signal (11)" in text,
            }
    sink.shutdown()
    write_results(out, "survival", results, markdown=survival_markdown(results))
    return results


async def _load(url: str, batches: Batches, seconds: float) -> list[load.Record]:
    client = GatewayClient(url, batches)
    try:
        return await load.closed_loop(client, SURVIVAL_CLIENTS, duration=seconds)
    finally:
        await client.close()


def survival_markdown(results: dict[str, Any]) -> str:
    rows = ["# Does Triton live through traced load? (null model, every request sampled)", "",
            f"{results['clients']} single-image clients for {results['seconds']:.0f} s per "
            "setting, each on a fresh Triton 2.51 started with OpenTelemetry tracing at rate 0.",
            "", "| GATEWAY_TRITON_SPANS | requests | answered 200 | statuses | last answer at s "
            "| Triton at the end | segfault in its log |",
            "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for setting, run in results["runs"].items():
        code = run["triton_exit_code"]
        state = "running" if code is None else f"exited {code}"
        rows.append(
            f"| {setting} | {run['requests']} | {run['ok']} | {run['statuses']} | "
            f"{run['answered_for_s']} | {state} | {'yes' if run['segfault_in_log'] else 'no'} |"
        )
    return "\n".join(rows) + "\n"


async def _measure(url: str, pool: list[bytes], seconds: float) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for key, batch, clients in (("single", 1, 8), ("batch_8", 8, 4)):
        batches = Batches(
            [[pool[(i * batch + j) % len(pool)] for j in range(batch)] for i in range(16)]
        )
        client = GatewayClient(url, batches)
        try:
            await load.closed_loop(client, clients, count=clients * 4)  # warm
            row[key] = load.summarize(await load.closed_loop(client, clients, duration=seconds))
        finally:
            await client.close()
    return row


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
    parser.add_argument(
        "--survival", type=float, metavar="SECONDS", default=None,
        help="instead: does Triton live through this long of traced load",
    )  # fmt: skip
    args = parser.parse_args(argv)
    out = study.out(args, "tracing")
    if args.survival is not None:
        survival(args.survival, out)
        print(out, flush=True)
        return 0
    return study.checked(out, run(args.minutes, out, args.smoke))
