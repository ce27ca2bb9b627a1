"""``python -m bench bulk``: the bulk job (``clip-gateway bulk``, a local Ray) against
``clip-gateway embed`` on the same gateway and files, as users run them, in interleaved pairs
(``embed``, the job, ...: the machine's load drifts, a pair shares it), on two stacks: the
gateway in front of the null model (at its own CPU limit, where the job must not be the
bottleneck: the CPU bar) and the ``cpu`` profile (the rate bar as its users see it). Each run:
its wall time, its processes' CPU from /proc by part (the job's Ray workers, its driver, Ray
Data's actors, Ray's daemons) and the gateway's and Triton's, over the whole run and over a
steady window, and the load average at its start. The issue's bars: the job's CPU per image at
most a quarter of the gateway's, its images/s at least 0.9x ``embed``'s.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.harness import models, study
from bench.harness.cpu import _cpu, cpu_seconds, tree
from bench.harness.machine import cpu_load, record
from bench.harness.output import write_results
from bench.harness.photos import compact_jpeg
from bench.harness.stack import running
from clip_gateway.config.processes import GatewayProcess
from clip_gateway.launcher.local import LocalTriton

ROOT = Path(__file__).resolve().parents[2]
#: Who spends a client's CPU, by process title (Ray's actors' processes are ``ray::Class``).
GROUPS = (("workers", ("ShardWorker",)), ("driver", ("clip_gateway bulk", "clip_gateway embed")))
#: The rest of a job's tree: GCS, raylet, dashboard, its agents, monitors, idle workers.
DAEMONS = "ray_daemons"
PARTS = (*(name for name, _ in GROUPS), DAEMONS)


class Sampler:
    """CPU seconds of a process tree, each process's last reading kept (the tree looked at every
    0.2 s, its CPU read every 0.05 s): what a process that ends spends after its last sample is
    missed (Ray's raylet reaps its workers); the root's own CPU is read from its zombie."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.seen: dict[int, tuple[str, float]] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        tick = 0
        while not self.stop.wait(0.05):
            scan = tick % 4 == 0  # and the titles again: a Ray worker names itself once started
            tick += 1
            for member in tree(self.pid) if scan else list(self.seen):
                known = self.seen.get(member, ("", 0.0))[0]
                try:
                    seconds = _cpu(Path(f"/proc/{member}/stat"))  # its own threads
                    # a process that has exited (a zombie) has no command line: keep its title
                    title = (_title(member) or known) if scan else known
                except OSError:
                    continue
                self.seen[member] = (title, seconds)

    def finish(self, process: subprocess.Popen[str]) -> None:
        """Once ``process`` (the root) has exited: its own CPU read from its zombie, then it is
        reaped (its exit status kept on ``process``)."""
        os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)
        with contextlib.suppress(OSError):
            title = self.seen.get(process.pid, ("", 0.0))[0]
            self.seen[process.pid] = (title, _cpu(Path(f"/proc/{process.pid}/stat")))
        self.stop.set()
        self.thread.join()
        process.wait()

    def parts(self) -> dict[str, float]:
        """CPU seconds by who spent them (``PARTS``), as last sampled."""
        spent = dict.fromkeys(PARTS, 0.0)
        for title, seconds in list(self.seen.values()):
            spent[group(title)] += seconds
        return spent


class Window:
    """The steady part of a run: every CPU counter read as the gateway's count (/metrics, every
    ``poll_s``) passes ``START`` and ``END`` of the run's images, leaving start-up and shutdown
    out, however much they vary from run to run."""

    START, END = 0.2, 0.9

    def __init__(
        self, url: str, images: int, sampler: Sampler, watch: list[int], poll_s: float
    ) -> None:
        self.url, self.sampler, self.watch, self.poll_s = url, sampler, watch, poll_s
        self.base = served(url)
        self.marks = [self.base + round(images * f) for f in (self.START, self.END)]
        self.snapshots: list[dict[str, Any]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while len(self.snapshots) < len(self.marks) and not self.stop.wait(self.poll_s):
            count = served(self.url)
            if count >= self.marks[len(self.snapshots)]:
                parts = self.sampler.parts()
                self.snapshots.append({
                    "t": time.monotonic(), "images": count - self.base, "parts": parts,
                    "served": [cpu_seconds(pid) for pid in self.watch],
                })  # fmt: skip

    def figures(self) -> dict[str, Any] | None:
        """CPU ms per image by part and the gateway's and Triton's, and the images/s, between
        the two marks; None when the run did not reach both."""
        self.stop.set()
        self.thread.join()
        if len(self.snapshots) < 2:
            return None
        a, b = self.snapshots
        images = b["images"] - a["images"]
        gateway, triton = (
            1000 * (y - x) / images for x, y in zip(a["served"], b["served"], strict=True)
        )
        return {
            "images": images,
            "images_per_s": round(images / (b["t"] - a["t"]), 1),
            "cpu_ms_per_image": {
                k: round(1000 * (b["parts"][k] - a["parts"][k]) / images, 3) for k in PARTS
            },
            "gateway_cpu_ms_per_image": round(gateway, 3),
            "triton_cpu_ms_per_image": round(triton, 3),
        }


def served(url: str) -> int:
    """The gateway's images embedded so far (its /metrics)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return int(sum(float(line.rpartition(" ")[2]) for line in text.splitlines()
                   if line.startswith("gateway_images_total")))  # fmt: skip


def group(title: str) -> str:
    return next((name for name, marks in GROUPS if any(m in title for m in marks)), DAEMONS)


def _title(pid: int) -> str:
    command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    return command.decode(errors="replace")[:80]


def _run(
    command: list[str], watch: list[int], url: str, images: int, poll_s: float
) -> dict[str, Any]:
    """``command`` to completion, its CPU (the whole tree, by part) and that of ``watch`` (the
    gateway at ``url``, Triton), over the run and over its steady ``Window``."""
    load = cpu_load()["load_avg"]
    before = {pid: cpu_seconds(pid) for pid in watch}
    started = time.monotonic()
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    sampler = Sampler(process.pid)
    window = Window(url, images, sampler, watch, poll_s)
    assert process.stdout is not None
    output = process.stdout.read()
    sampler.finish(process)
    steady = window.figures()
    wall = time.monotonic() - started
    parts = sampler.parts()
    gateway, triton = (cpu_seconds(pid) - before[pid] for pid in watch)
    return {
        "command": " ".join(command[2:]),
        "exit": process.returncode,
        "wall_s": round(wall, 2),
        "client_cpu_s": round(sum(parts.values()), 2),
        "parts_cpu_s": {k: round(v, 2) for k, v in parts.items()},
        "gateway_cpu_s": round(gateway, 2),
        "triton_cpu_s": round(triton, 2),
        "steady": steady,
        "load_avg_at_start": load,
        "tail": output.strip().splitlines()[-2:],
    }


def write_photos(folder: Path, photos: list[bytes], count: int, *, copies: bool = False) -> int:
    """``count`` of ``photos`` in ``folder`` (round and round); with ``copies``, each with a JPEG
    comment after SOI saying which file it is, so that each is its own bytes (``embed`` keeps
    one row per content) and the gateway decodes each the same; their mean size."""
    folder.mkdir(parents=True)
    total = 0
    for i in range(count):
        data = photos[i % len(photos)]
        if copies:
            comment = f"copy {i}".encode()
            data = (
                data[:2] + b"\xff\xfe" + (len(comment) + 2).to_bytes(2, "big") + comment + data[2:]
            )
        (folder / f"{i:06d}.jpg").write_bytes(data)
        total += len(data)
    return round(total / count)


def commands(
    folder: Path, library: str, out: str, url: str, args: argparse.Namespace
) -> tuple[list[str], list[str]]:
    """``clip-gateway embed`` and ``clip-gateway bulk`` over ``folder`` against ``url``."""
    cli = [sys.executable, "-m", "clip_gateway"]
    batch, in_flight = str(args.batch_size), str(args.in_flight)
    embed = [*cli, "embed", str(folder), "--out", library, "--url", url,
             "--batch-size", batch, "--concurrency", in_flight]  # fmt: skip
    bulk = [*cli, "bulk", str(folder), out, "--gateway", url, "--no-captions",
            "--batch-size", batch, "--in-flight", in_flight,
            "--workers", str(args.workers), "--num-cpus", str(os.cpu_count() or 2)]  # fmt: skip
    return embed, bulk


def pair_runs(
    tmp: Path,
    folder: Path,
    images: int,
    url: str,
    watch: list[int],
    args: argparse.Namespace,
    poll_s: float,
    keep: Path | None = None,
) -> list[dict[str, Any]]:
    """``args.pairs`` pairs over ``folder``, each ``embed`` then the job; fresh outputs (the
    first job's in ``keep`` where given)."""
    pairs = []
    for i in range(args.pairs):
        pair: dict[str, Any] = {}
        for client in ("embed", "bulk"):
            out = keep if keep and i == 0 and client == "bulk" else tmp / f"out-{i}-{client}"
            embed, bulk = commands(folder, f"{out}.npz", str(out), url, args)
            run = _run(embed if client == "embed" else bulk, watch, url, images, poll_s)
            pair[client] = figures_of(run, images)
            print(f"pair {i + 1} {client}: {pair[client]}", flush=True)
        pair["ratios"] = ratios(pair)
        pairs.append(pair)
    return pairs


def figures_of(run: dict[str, Any], images: int) -> dict[str, Any]:
    """A run's images/s (none if it did not finish) and CPU per image, start-up included, and
    each part's start-up: its CPU beyond the steady cost of the run's images."""
    finished = run["exit"] in (0, 3)
    run["images_per_s"] = round(images / run["wall_s"], 2) if finished else None
    run["cpu_ms_per_image"] = {
        k: round(1000 * v / images, 3) for k, v in run["parts_cpu_s"].items()
    }
    run["gateway_cpu_ms_per_image"] = round(1000 * run["gateway_cpu_s"] / images, 3)
    steady = run["steady"]
    if steady is not None:
        run["start_up_cpu_s"] = {
            k: round(v - images * steady["cpu_ms_per_image"][k] / 1000, 2)
            for k, v in run["parts_cpu_s"].items()
        }
    return run


def ratios(pair: dict[str, Any]) -> dict[str, float | None]:
    """The bars in one pair: the job's steady CPU per image against the gateway's in the same
    run (its workers; workers and driver; everything, Ray's daemons included), ``embed``'s
    likewise, and the job's images/s against ``embed``'s."""
    job, embed = pair["bulk"], pair["embed"]
    found: dict[str, float | None] = {}
    if job["steady"] is not None:
        ms, gateway = job["steady"]["cpu_ms_per_image"], job["steady"]["gateway_cpu_ms_per_image"]
        found["workers_vs_gateway"] = round(ms["workers"] / gateway, 3)
        found["job_vs_gateway"] = round((ms["workers"] + ms["driver"]) / gateway, 3)
        found["all_in_vs_gateway"] = round(sum(ms.values()) / gateway, 3)
    if (e := embed["steady"]) is not None:
        found["embed_vs_gateway"] = round(
            sum(e["cpu_ms_per_image"].values()) / e["gateway_cpu_ms_per_image"], 3
        )
    both = job["images_per_s"] and embed["images_per_s"]
    found["rate_vs_embed"] = round(job["images_per_s"] / embed["images_per_s"], 3) if both else None
    if job["steady"] is not None and embed["steady"] is not None:
        found["steady_rate_vs_embed"] = round(
            job["steady"]["images_per_s"] / embed["steady"]["images_per_s"], 3
        )
    return found


def null_runs(tmp: Path, photos: list[bytes], args: argparse.Namespace) -> dict[str, Any]:
    """The pairs against the gateway in front of the null model (the canary off, as in cost)."""
    folder = tmp / "null-photos"
    figures: dict[str, Any] = {
        "images": args.null_images,
        "photo_bytes_mean": write_photos(folder, photos, args.null_images, copies=True),
    }
    repo = models.null_repository(models.export(), tmp / "null-repo")
    env = {"GATEWAY_CANARY_INTERVAL_S": "0"}
    with (
        LocalTriton(repo, log_path=tmp / "null-triton.log") as triton,
        GatewayProcess(triton.grpc_url, env=env, log_path=tmp / "null-gateway.log") as gateway,
    ):
        gateway.wait_ready()
        assert gateway.process is not None and triton.process is not None
        watch = [gateway.process.pid, triton.process.pid]
        figures["pairs"] = pair_runs(
            tmp / "null", folder, args.null_images, gateway.url, watch, args, poll_s=0.1
        )
    figures["medians"] = medians(figures["pairs"])
    return figures


def real_runs(tmp: Path, photos: list[bytes], args: argparse.Namespace) -> dict[str, Any]:
    """The pairs on the real stack (the ``cpu`` profile), distinct photos."""
    with running() as stack:
        folder = tmp / "photos"
        figures: dict[str, Any] = {
            "images": args.images,
            "photo_bytes_mean": write_photos(folder, photos, args.images),
        }
        gateway, triton = stack.gateway.process, stack.triton.process
        assert gateway is not None and triton is not None
        watch = [gateway.pid, triton.pid]
        figures["pairs"] = pair_runs(
            tmp / "real", folder, args.images, stack.gateway.url, watch, args, 1.0, args.keep
        )
    figures["medians"] = medians(figures["pairs"])
    return figures


def medians(pairs: list[dict[str, Any]]) -> dict[str, float | None]:
    """Each ratio's median over the pairs that have it."""
    keys = sorted({k for p in pairs for k in p["ratios"]})
    found = {k: [p["ratios"][k] for p in pairs if p["ratios"].get(k) is not None] for k in keys}
    return {k: round(statistics.median(v), 3) if v else None for k, v in found.items()}


def main(argv: list[str]) -> int:
    parser = study.parser("bulk", __doc__)
    parser.add_argument("--images", type=int, default=2000, help="cpu profile photos (0: none)")
    parser.add_argument("--null-images", type=int, default=10_000, help="null model's (0: none)")
    parser.add_argument("--pairs", type=int, default=3, help="interleaved pairs on each stack")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--in-flight", type=int, default=2, help="both clients, per gateway")
    parser.add_argument("--workers", type=int, default=2, help="the job's Ray workers")
    parser.add_argument("--keep", type=Path, help="the first cpu-profile job's output kept here")
    args = parser.parse_args(argv)
    keys = ("images", "batch_size", "in_flight", "workers", "pairs")
    results: dict[str, Any] = {"machine": record(), **{k: getattr(args, k) for k in keys}}
    photos = [compact_jpeg(5000 + i) for i in range(args.images or 2000)]
    with tempfile.TemporaryDirectory(prefix="bench-bulk-") as tmp:
        if args.null_images:
            results["null"] = null_runs(Path(tmp), photos, args)
        if args.images:
            results["real"] = real_runs(Path(tmp), photos, args)
    write_results(study.out(args, "bulk"), "bulk", results, markdown=_markdown(results))
    print(_markdown(results))
    return 0


def _parts(ms: dict[str, float]) -> str:
    return " | ".join(f"{ms[k]}" for k in PARTS)


RATIOS = ("workers_vs_gateway", "job_vs_gateway", "all_in_vs_gateway", "embed_vs_gateway",
          "rate_vs_embed", "steady_rate_vs_embed")  # fmt: skip


def _stack_markdown(title: str, intro: str, r: dict[str, Any]) -> list[str]:
    runs, steady, ratio_rows = [], [], []
    for i, pair in enumerate(r["pairs"], 1):
        for client in ("embed", "bulk"):
            run = pair[client]
            runs.append(
                f"| {i} | `{client}` | {run['exit']} | {run['wall_s']} | "
                f"{run['images_per_s'] or 'did not finish'} | {_parts(run['parts_cpu_s'])} | "
                f"{run['gateway_cpu_s']} | {run['triton_cpu_s']} | "
                f"{run['load_avg_at_start'][0]:.2f} |"
            )
            if (f := run["steady"]) is None:
                continue
            start = run["start_up_cpu_s"]
            steady.append(
                f"| {i} | `{client}` | {f['images']} | {f['images_per_s']} | "
                f"{_parts(f['cpu_ms_per_image'])} | {f['gateway_cpu_ms_per_image']} | "
                f"{f['triton_cpu_ms_per_image']} | {sum(start.values()):.1f} |"
            )
        ratio_rows.append(
            f"| {i} | " + " | ".join(str(pair["ratios"].get(k)) for k in RATIOS) + " |"
        )
    m = r["medians"]
    return [
        f"## {title}",
        "",
        intro.format(images=r["images"], mean=r["photo_bytes_mean"]),
        "",
        "Each run, CPU seconds by part over the whole run (`embed` is one process: its "
        "driver column):",
        "",
        "| pair | client | exit | wall s | images/s | workers | driver "
        "| Ray daemons | gateway | Triton | load avg (1 min) at start |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *runs,
        "",
        f"The steady window (from {Window.START:.0%} to {Window.END:.0%} of the images, by the "
        "gateway's own count), CPU ms per image by part; start-up: the run's CPU seconds "
        "beyond its images at the steady cost:",
        "",
        "| pair | client | images | images/s | workers | driver "
        "| Ray daemons | gateway | Triton | start-up CPU s |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *steady,
        "",
        "Ratios: steady CPU per image against the gateway's in the same run (bar <= 0.25 "
        "for the job); images/s against `embed`'s, whole runs and steady windows (bar >= 0.9):",
        "",
        "| pair | " + " | ".join(RATIOS) + " |",
        "|---" * (len(RATIOS) + 1) + "|",
        *ratio_rows,
        "| median | " + " | ".join(str(m.get(k)) for k in RATIOS) + " |",
        "",
    ]


def _markdown(r: dict[str, Any]) -> str:
    machine = r["machine"]
    lines = [
        "# The bulk job beside `clip-gateway embed`",
        "",
        f"Batch {r['batch_size']}, {r['in_flight']} requests in flight for both clients; "
        f"the job on a local Ray with {r['workers']} workers; {r['pairs']} interleaved "
        f"pairs (`embed`, then the job). {machine['cpu']}, {machine['cores']} cores, "
        f"commit {machine['git_commit']}, {machine['when']}. Parts of the job's CPU: its "
        "Ray workers (`ray::ShardWorker`), its driver (`clip-gateway bulk`), "
        "Ray's daemons (GCS, raylet, dashboard, its agents, monitors, idle workers).",
        "",
    ]
    if "null" in r:
        lines += _stack_markdown(
            "Against the null model: the gateway at its own CPU limit",
            "The gateway in front of the null model (bench/triton_null; its defaults, canary "
            "off); {images} copies of compact JPEGs in one folder, each its own bytes (mean "
            "{mean:,}).",
            r["null"],
        )
    if "real" in r:
        lines += _stack_markdown(
            "The CPU profile: the rate as its users see it",
            "{images} compact JPEGs (mean {mean:,} bytes) in one folder; one gateway on the "
            "`cpu` profile (ViT-B-32, random weights).",
            r["real"],
        )
    return "\n".join(lines)
