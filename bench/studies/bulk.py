"""``python -m bench bulk``: the bulk job (``clip-gateway bulk``, a local Ray) against
``clip-gateway embed`` on the same gateway (the real stack: export, Triton ``cpu`` profile, the
gateway) and the same files: a folder of compact JPEGs, each command as users run it.

What it measures: each run's wall time and images/s, the CPU seconds of each client (the bulk
job's whole process tree, Ray's own processes included, sampled from /proc while it runs; its
Ray workers alone; ``embed``'s process) and of the gateway and Triton over the same run, per
image. The issue's bars: the job's CPU per image at most a quarter of the gateway's, and the
job's images/s at least 0.9x ``embed``'s. Writes ``bench/results/bulk/bulk.{json,md}``, with
the load average at the start of each run (the machine is shared).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.harness import study
from bench.harness.cpu import _cpu, cpu_seconds, tree
from bench.harness.machine import cpu_load, record
from bench.harness.output import write_results
from bench.harness.photos import compact_jpeg
from bench.harness.stack import running

ROOT = Path(__file__).resolve().parents[2]


class Sampler:
    """CPU seconds of a process tree, every process's last reading kept, so processes that end
    during the run (Ray's workers, its head's processes at shutdown) still count up to their
    last sample (0.2 s apart)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.seen: dict[int, tuple[str, float]] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.2):
            for member in tree(self.pid):
                try:
                    title = Path(f"/proc/{member}/cmdline").read_bytes().replace(b"\0", b" ")
                    seconds = _cpu(Path(f"/proc/{member}/stat"))  # its own threads
                except OSError:
                    continue
                self.seen[member] = (title.decode(errors="replace")[:80], seconds)

    def total(self, containing: str = "") -> float:
        self.stop.set()
        self.thread.join()
        return sum(s for title, s in self.seen.values() if containing in title)


def _run(command: list[str], watch: list[int]) -> dict[str, Any]:
    """``command`` to completion, its CPU (the whole tree) and that of ``watch`` over it."""
    load = cpu_load()["load_avg"]
    before = {pid: cpu_seconds(pid) for pid in watch}
    started = time.monotonic()
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    sampler = Sampler(process.pid)
    output, _ = process.communicate()
    wall = time.monotonic() - started
    job_cpu = sampler.total()
    workers_cpu = sampler.total("MapWorker")
    return {
        "command": " ".join(command[2:]),
        "exit": process.returncode,
        "wall_s": round(wall, 2),
        "client_cpu_s": round(job_cpu, 2),
        "ray_workers_cpu_s": round(workers_cpu, 2),
        "served_cpu_s": {str(pid): round(cpu_seconds(pid) - before[pid], 2) for pid in watch},
        "load_avg_at_start": load,
        "tail": output.strip().splitlines()[-3:],
    }


def main(argv: list[str]) -> int:
    parser = study.parser("bulk", __doc__)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--in-flight",
        type=int,
        default=2,
        help="both clients, per gateway (docs/BULK.md: 1-2 on a CPU profile)",
    )
    parser.add_argument("--workers", type=int, default=2, help="the job's Ray workers")
    parser.add_argument(
        "--keep",
        type=Path,
        default=None,
        help="keep the job's output here (e.g. to build an autofaiss index on it)",
    )
    args = parser.parse_args(argv)
    results: dict[str, Any] = {
        "machine": record(),
        "images": args.images,
        "batch_size": args.batch_size,
        "in_flight": args.in_flight,
        "workers": args.workers,
    }
    with tempfile.TemporaryDirectory(prefix="bench-bulk-") as tmp, running() as stack:
        folder = Path(tmp) / "photos"
        folder.mkdir()
        for i in range(args.images):
            (folder / f"{i:06d}.jpg").write_bytes(compact_jpeg(5000 + i))
        results["photo_bytes_mean"] = round(
            sum(p.stat().st_size for p in folder.iterdir()) / args.images
        )
        gateway, triton = stack.gateway.process, stack.triton.process
        assert gateway is not None and triton is not None
        watch = [gateway.pid, triton.pid]
        cli = [sys.executable, "-m", "clip_gateway"]
        results["embed"] = _run(
            [
                *cli,
                "embed",
                str(folder),
                "--out",
                f"{tmp}/library.npz",
                "--url",
                stack.gateway.url,
                "--batch-size",
                str(args.batch_size),
                "--concurrency",
                str(args.in_flight),
            ],
            watch,
        )
        results["bulk"] = _run(
            [
                *cli,
                "bulk",
                str(folder),
                str(args.keep) if args.keep else f"{tmp}/out",
                "--gateway",
                stack.gateway.url,
                "--no-captions",
                "--batch-size",
                str(args.batch_size),
                "--in-flight",
                str(args.in_flight),
                "--workers",
                str(args.workers),
                "--num-cpus",
                str(os.cpu_count() or 2),
            ],
            watch,
        )
    ratios(results, watch)
    write_results(study.out(args, "bulk"), "bulk", results, markdown=_markdown(results))
    print(_markdown(results))
    return 0


def ratios(results: dict[str, Any], watch: list[int]) -> None:
    """Per-image figures and the two bars. A run that did not finish (``embed`` gives up on a
    429 its retries do not outlast) has no rate: its wall time is when it gave up."""
    images = results["images"]
    for run in ("embed", "bulk"):
        figures = results[run]
        finished = figures["exit"] in (0, 3)
        figures["images_per_s"] = round(images / figures["wall_s"], 2) if finished else None
        gateway_s, triton_s = (figures["served_cpu_s"][str(p)] for p in watch)
        figures["gateway_cpu_ms_per_image"] = round(1000 * gateway_s / images, 3)
        figures["triton_cpu_ms_per_image"] = round(1000 * triton_s / images, 3)
        figures["client_cpu_ms_per_image"] = round(1000 * figures["client_cpu_s"] / images, 3)
    bulk, embed = results["bulk"], results["embed"]
    both = bulk["images_per_s"] and embed["images_per_s"]
    results["job_rate_vs_embed"] = (
        round(bulk["images_per_s"] / embed["images_per_s"], 3) if both else None
    )
    results["job_cpu_vs_gateway"] = round(
        bulk["client_cpu_ms_per_image"] / bulk["gateway_cpu_ms_per_image"], 3
    )
    results["job_workers_cpu_vs_gateway"] = round(
        bulk["ray_workers_cpu_s"] / images * 1000 / bulk["gateway_cpu_ms_per_image"], 3
    )


def _markdown(r: dict[str, Any]) -> str:
    rows = []
    for run in ("embed", "bulk"):
        f = r[run]
        workers = f"{1000 * f['ray_workers_cpu_s'] / r['images']:.2f}" if run == "bulk" else "–"
        rows.append(
            f"| `clip-gateway {run}` | {f['exit']} | {f['wall_s']} | "
            f"{f['images_per_s'] or 'did not finish'} | "
            f"{f['client_cpu_ms_per_image']} | {workers} | {f['gateway_cpu_ms_per_image']} "
            f"| {f['triton_cpu_ms_per_image']} | {f['load_avg_at_start'][0]:.2f} |"
        )
    machine = r["machine"]
    return "\n".join(
        [
            "# The bulk job beside `clip-gateway embed`",
            "",
            f"{r['images']} compact JPEGs (mean {r['photo_bytes_mean']:,} bytes) in one folder; "
            "one gateway on the `cpu` profile (ViT-B-32, random weights); batch "
            f"{r['batch_size']}, {r['in_flight']} requests in flight for both; the job on a "
            f"local Ray with {r['workers']} workers. {machine['cpu']}, {machine['cores']} "
            f"cores, commit {machine['git_commit']}, {machine['when']}.",
            "",
            "| client | exit | wall s | images/s | client CPU ms/image | of it Ray workers "
            "| gateway CPU ms/image | Triton CPU ms/image | load avg (1 min) at start |",
            "|---|---|---|---|---|---|---|---|---|",
            *rows,
            "",
            f"The job's images/s against `embed`'s: {r['job_rate_vs_embed'] or 'none'} (bar: >= "
            "0.9x; none: a run did not finish). The "
            f"job's CPU per image against the gateway's: {r['job_cpu_vs_gateway']} with Ray's own "
            f"processes and start-up, {r['job_workers_cpu_vs_gateway']} for its workers alone "
            "(bar: <= 0.25).",
            "",
        ]
    )
