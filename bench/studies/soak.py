"""``python -m bench soak``: steady load for minutes; the gateway's memory, descriptors and
threads must not grow (sampled from /proc), and every answer must still be the right one."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from bench.harness import load, study
from bench.harness.clients import GatewayClient
from bench.harness.output import write_results
from bench.harness.stack import reference_batches, running


def process_stats(pid: int) -> dict[str, float]:
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    fields = dict(line.split(":", 1) for line in status if ":" in line)
    return {
        "rss_mb": int(fields["VmRSS"].split()[0]) / 1024,
        "threads": int(fields["Threads"]),
        "fds": len(list(Path(f"/proc/{pid}/fd").iterdir())),
    }


def thread_names(pid: int) -> dict[str, int]:
    """Threads by name (``/proc/<pid>/task/*/comm``), so a growth says which pool grew."""
    names: dict[str, int] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
        except OSError:  # the thread ended between listing and reading
            continue
        names[name] = names.get(name, 0) + 1
    return dict(sorted(names.items()))


def run(minutes: float, out: Path, smoke: bool = False) -> dict[str, Any]:
    duration = 20.0 if smoke else minutes * 60
    interval = 2.0 if smoke else 10.0
    with running({"GATEWAY_DECODE_THREADS": "2"}) as stack:
        batches = reference_batches(stack.gateway.url, images=8, batch=4)
        pid = stack.gateway.process.pid if stack.gateway.process else 0

        async def soak() -> tuple[list[load.Record], list[dict[str, Any]]]:
            client = GatewayClient(stack.gateway.url, batches)
            samples: list[dict[str, Any]] = []
            started = time.monotonic()

            def snapshot() -> dict[str, Any]:
                t = round(time.monotonic() - started, 1)
                return {"t": t, **process_stats(pid), "names": thread_names(pid)}

            async def sample() -> None:
                while True:
                    samples.append(snapshot())
                    await asyncio.sleep(interval)

            sampler = asyncio.create_task(sample())
            try:
                records = await load.closed_loop(client, 4, duration=duration)
            finally:
                sampler.cancel()
                samples.append(snapshot())
                await client.close()
            return records, samples

        records, samples = asyncio.run(soak())
    # growth is measured after the first fifth (imports, pools and caches warming up)
    settled = [s for s in samples if s["t"] >= duration / 5] or samples
    first, last = settled[0], samples[-1]
    results = {
        "minutes": round(duration / 60, 2),
        "load": load.summarize(records),
        "rss_growth_mb": round(last["rss_mb"] - first["rss_mb"], 1),
        "fd_growth": last["fds"] - first["fds"],
        "thread_growth": last["threads"] - first["threads"],
        "threads_grown": {
            name: count - first["names"].get(name, 0)
            for name, count in last["names"].items()
            if count > first["names"].get(name, 0)
        },
        "samples": samples,
    }
    write_results(out, "soak", results, markdown=(
        f"# Soak: {results['minutes']} min of steady load (4 clients, 4-image requests)\n\n"
        f"{results['load']['requests']} requests, {results['load']['ok']} OK, "
        f"{results['load']['wrong']} wrong, {results['load']['images_per_s']} img/s, p99 "
        f"{results['load'].get('latency_ms', {}).get('p99')} ms. Gateway process after warm-up: "
        f"RSS {first['rss_mb']:.1f} → {last['rss_mb']:.1f} MB ({results['rss_growth_mb']:+} MB), "
        f"fds {first['fds']} → {last['fds']}, threads {first['threads']} → {last['threads']}.\n"
    ))  # fmt: skip
    return results


def main(argv: list[str]) -> int:
    parser = study.parser("soak", __doc__, smoke="seconds, for CI")
    parser.add_argument("--minutes", type=float, default=10.0)
    args = parser.parse_args(argv)
    out = study.out(args, "soak")
    return study.checked(out, run(args.minutes, out, args.smoke))
