"""``python -m bench host``: one GPU host measured end to end, in one command (docs/GPU_HOST.md).

Three phases, on whatever machine it runs (a lent GPU host, or this CPU machine as a rehearsal):

- **CPU wall**: the gateway with 1, 2, 4, 8 workers (one core each, the core plan's decode
  threads for that core) and with the core plan on every gateway core, in front of the null Triton
  model (bench/triton_null), fed the client's uploads at batch 32 by load generators on cores of
  their own; Triton on cores of its own. Images/s, gateway CPU-seconds per image (its /proc
  accounting), scaling per worker.
- **Engine through Triton**: each model's exported graphs served by Triton (the ``cuda`` profile
  on the Python backend's CUDA EP: the PyPI tritonserver has no onnxruntime backend; on a CPU
  machine the ``cpu`` profile), through ``/v1/embeddings``: batch 1 / 8 / 32 x a concurrency
  sweep, images/s, p50/p99, GPU utilisation (NVML), gateway CPU per image; texts/s; parity of
  the served embeddings against open_clip FP32 on the CPU.
- **Ceilings** beside it: the same graph alone in ONNX Runtime at the same batches, and open_clip
  in torch FP16 on device tensors, so the gateway's overhead is a ratio.

Every cell reports Triton's CPU per image beside the gateway's (its process tree: the server and
the Python-backend stubs it starts; bench/harness/triton_side.py), and in the engine phase what
the model's counters say (rows per execution, copies per row, a page-locked batch buffer).

Cores are split when there are enough (12 or more; bench/harness/cores.py): the load generators
on the last four, and of the rest Triton gets the share of them its measured CPU per image says:
each phase starts with a short calibration cell at batch 32 that measures both sides, and Triton
(running) is moved onto ``ceil(share x rest)`` cores (at least 3: on one its Python backend
stalled), the gateway onto the others, in the order
the CPU topology gives (SMT siblings together; the gateway's workers on distinct physical cores
first). On fewer (this 2-core machine) nothing is pinned and the JSON says so; the calibration
is measured all the same. Results: ``bench/results/host/`` (host.json, host.md, host.png),
written after every phase.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import pickle
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import simplejpeg

from bench.harness import study
from bench.harness.cores import Cores, Topology, pin_tree, pinned, triton_share
from bench.harness.cpu import per_cpu_second_for
from bench.harness.output import figure, write_results
from bench.harness.triton_side import TritonSide

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Sweep:
    """How much of each phase runs: the full run on a GPU host, a smoke for CI."""

    workers: tuple[int, ...] = (1, 2, 4, 8)
    wall_seconds: float = 8.0
    models: tuple[str, ...] = ("ViT-B-32", "ViT-B-16")
    batches: tuple[int, ...] = (1, 8, 32)
    #: 64: on the H200 host 16 clients of 32 left the GPU 42 % busy and both sides' CPUs part
    #: idle (8,766 images/s at a 53 ms p50: closed-loop clients were the bound)
    concurrency: tuple[int, ...] = (1, 4, 16, 64)
    cell_seconds: float = 4.0
    text_concurrency: tuple[int, ...] = (4, 16)
    ceiling_batches: tuple[int, ...] = (1, 8, 32, 128)
    ceiling_seconds: float = 2.0
    #: Triton's largest batch on the GPU: four 32-image requests merged (bench/results/gpu:
    #: ViT-B-32 FP16 8,910 images/s alone at 32, 13,343 at 128).
    max_batch_size: int = 128
    #: The engine phase's gateway: workers and decode threads per worker (0: the core plan's).
    workers_engine: int = 0
    threads_engine: int = 0
    #: Each phase's first cell, that measures both sides' CPU per image for the core split:
    #: its batch (the engine phase's; the null model's is always 32) and length.
    calibration_batch: int = 32
    calibration_seconds: float = 4.0
    #: CPU-seconds of each decode-only process beside a CPU-wall row (``decode_alongside``).
    decode_seconds: float = 2.0


FULL = Sweep()
SMOKE = Sweep(
    workers=(1, 2),
    wall_seconds=3.0,
    models=("ViT-B-32",),
    batches=(1, 8),
    concurrency=(1, 2),
    cell_seconds=1.5,
    text_concurrency=(2,),
    ceiling_batches=(1, 8),
    ceiling_seconds=0.5,
    max_batch_size=32,
    calibration_batch=8,  # the CPU engine takes seconds per batch of 32
    decode_seconds=0.3,
    calibration_seconds=1.5,
)


# -- inputs ----------------------------------------------------------------------------------


def uploads(count: int, size: int) -> list[bytes]:
    """What the client SDK uploads for a ``size``-px model that resizes the short side and
    crops the centre, as ``/v1/models`` says (clip_gateway/client/compact.py): the square."""
    from bench.harness.photos import jpeg
    from clip_gateway.client.compact import CompactOptions, compact
    from clip_gateway.model.calibration import photo

    card = {"image_size": size, "preprocessing": {"resize_mode": "shortest"}}
    options = CompactOptions().for_model(card)
    return [compact(jpeg(photo(1600, 1200, 1000 + i)), options) for i in range(count)]


def use_uploads(work: Path, size: int) -> None:
    """The load processes' pool (``size``-px uploads), made once and read by each of them."""
    path = work / f"uploads-{size}.pickle"
    if not path.exists():
        path.write_bytes(pickle.dumps(uploads(64, size)))
    os.environ["BENCH_HOST_UPLOADS"] = str(path)


def parity_images(count: int, size: int) -> tuple[list[bytes], np.ndarray]:
    """Lossless ``size`` x ``size`` PNGs and their pixels: the gateway only decodes them, so the
    served embedding is the model's alone, comparable with open_clip on the same pixels."""
    from clip_gateway.model.calibration import photo

    files, pixels = [], []
    for i in range(count):
        image = photo(size, size, 2000 + i)
        buffer = io.BytesIO()
        image.save(buffer, "PNG")
        files.append(buffer.getvalue())
        pixels.append(np.asarray(image.convert("RGB")))
    return files, np.stack(pixels)


TEXTS = [f"a photo of {noun} number {i}" for i, noun in enumerate(
    ["a cat", "a dog", "the sea", "a red car", "two people", "a mountain", "a city at night",
     "a bowl of soup"] * 4)]  # fmt: skip


# -- load generators -------------------------------------------------------------------------


def _load_command(url: str, batch: int, concurrency: int, seconds: float, texts: bool) -> list[str]:
    return [sys.executable, "-m", "bench.harness.child", "host", "load", url, str(batch),
            str(concurrency), str(seconds), "texts" if texts else "images"]  # fmt: skip


#: The gateway's Server-Timing stages: a request's decode and preprocessing, then its Triton call
#: (wall milliseconds inside the gateway; the rest of the client's latency is HTTP and queueing).
SERVER_STAGES = ("decode", "infer")


def drive(
    url: str, batch: int, concurrency: int, seconds: float, cores: Cores, *, texts: bool = False
) -> dict[str, Any]:
    """``concurrency`` closed-loop clients over as many load processes as there are load cores
    (one when not pinned), for ``seconds``; their records merged."""
    processes = max(1, min(len(cores.load) or 1, concurrency))
    shares = [concurrency // processes + (i < concurrency % processes) for i in range(processes)]
    children = []
    for i, share in enumerate(shares):
        with pinned(cores.load[i : i + 1] if cores.load else ()):
            children.append(subprocess.Popen(
                _load_command(url, batch, share, seconds, texts), cwd=ROOT,
                stdout=subprocess.PIPE, text=True))  # fmt: skip
    found = [json.loads(child.communicate(timeout=seconds + 120)[0]) for child in children]
    latencies = np.array([ms for f in found for ms in f["latencies_ms"]])
    items = sum(f["items"] for f in found)
    elapsed = max(f["seconds"] for f in found)
    statuses: dict[str, int] = {}
    for f in found:
        for status, n in f["statuses"].items():
            statuses[status] = statuses.get(status, 0) + n
    row: dict[str, Any] = {
        "batch": batch, "concurrency": concurrency, "load_processes": processes,
        "requests": sum(statuses.values()), "ok": statuses.get("200", 0), "statuses": statuses,
        "items": items, "seconds": round(elapsed, 2),
        "items_per_s": round(items / elapsed, 1) if elapsed else 0.0,
    }  # fmt: skip
    if len(latencies):
        row["p50_ms"] = round(float(np.percentile(latencies, 50)), 2)
        row["p99_ms"] = round(float(np.percentile(latencies, 99)), 2)
    if timed := sum(f["server_ms_count"] for f in found):
        row["gateway_ms_per_request"] = {
            stage: round(sum(f["server_ms_sum"][stage] for f in found) / timed, 2)
            for stage in SERVER_STAGES
        }
    return row


def decode_alongside(cpus: tuple[int, ...], processes: int, seconds: float) -> dict[str, Any]:
    """Decode-only of the uploads in ``processes`` processes at once on ``cpus``: what a decode
    costs the machine itself as its CPUs get busy (clock, caches, memory), with no gateway: the
    machine's share of a CPU-wall row's per-image growth with workers."""
    command = [sys.executable, "-m", "bench.harness.child", "host", "decode", str(seconds)]
    children = []
    for i in range(processes):
        with pinned(cpus[i : i + 1]):
            children.append(subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True))
    each = [float(child.communicate(timeout=20 * seconds + 60)[0]) for child in children]
    mean = round(sum(each) / len(each), 1)
    return {"decode_only_us_per_item": mean, "decode_only_processes": len(each)}


def _read(path: str) -> bytes:
    """A file's bytes (the load process reads its pool once, before any request)."""
    return Path(path).read_bytes()


async def _load(url: str, batch: int, concurrency: int, seconds: float, texts: bool) -> None:
    import httpx

    from bench.harness import load
    from bench.harness.clients import Batches, GatewayClient

    if texts:
        http = httpx.AsyncClient(base_url=url, timeout=120)

        async def call(index: int) -> load.Reply:
            body = {"input": [TEXTS[(index + j) % len(TEXTS)] for j in range(batch)],
                    "encoding_format": "base64"}  # fmt: skip
            try:
                response = await http.post("/v1/embeddings", json=body)
            except httpx.HTTPError:
                return load.Reply(599, 0)
            return load.Reply(response.status_code, batch)

        records = await load.closed_loop(call, concurrency, duration=seconds, warmup=2)
        await http.aclose()
    else:
        pool = pickle.loads(_read(os.environ["BENCH_HOST_UPLOADS"]))
        batches = Batches([[pool[(i * batch + j) % len(pool)] for j in range(batch)]
                           for i in range(16)])  # fmt: skip
        client = GatewayClient(url, batches)
        try:
            records = await load.closed_loop(client, concurrency, duration=seconds, warmup=2)
        finally:
            await client.close()
    ok = [r for r in records if r.reply.status == 200]
    statuses: dict[str, int] = {}
    for r in records:
        statuses[str(r.reply.status)] = statuses.get(str(r.reply.status), 0) + 1
    elapsed = max((r.start + r.latency for r in records), default=0.0)
    timed = [r.reply.server_ms for r in ok if r.reply.server_ms]  # the gateway's Server-Timing
    print(json.dumps({"items": sum(r.reply.images for r in ok), "seconds": elapsed,
                      "statuses": statuses,
                      "latencies_ms": [round(r.latency * 1000, 3) for r in ok],
                      "server_ms_sum": {stage: sum(t.get(stage, 0.0) for t in timed)
                                        for stage in SERVER_STAGES},
                      "server_ms_count": len(timed)}))  # fmt: skip


# -- measurement helpers ---------------------------------------------------------------------


class GpuSampler:
    """The GPU's utilisation (NVML) every 100 ms while it runs; nothing where NVML is absent."""

    def __init__(self) -> None:
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handle: Any = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:  # no driver, no GPU, no nvidia-ml-py: nothing to sample
            self._handle = None

    def __enter__(self) -> GpuSampler:
        if self._handle is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        import pynvml

        while not self._stop.wait(0.1):
            self.samples.append(int(pynvml.nvmlDeviceGetUtilizationRates(self._handle).gpu))

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def mean(self) -> float | None:
        return round(float(np.mean(self.samples)), 1) if self.samples else None


def measured(
    url: str,
    pid: int,
    batch: int,
    concurrency: int,
    seconds: float,
    cores: Cores,
    triton: TritonSide | None = None,
    **kw: Any,
) -> dict[str, Any]:
    """One load cell with the gateway's CPU time, Triton's (``triton``: its process tree and the
    model's counters) and the GPU's utilisation over it."""
    from bench.harness.cpu import each_process

    before = each_process(pid)
    triton_before = triton.snapshot() if triton else None
    with GpuSampler() as gpu:
        row = drive(url, batch, concurrency, seconds, cores, **kw)
    after = each_process(pid)
    spent = sum(after.values()) - sum(before.get(p, 0.0) for p in after)
    row["gateway_cpu_s"] = round(spent, 2)
    # each worker's share: connections land on workers, and a worker left idle shows here
    row["worker_cpu_s"] = sorted((round(after[p] - before.get(p, 0.0), 2) for p in after
                                  if p != pid), reverse=True)  # fmt: skip
    row["gateway_cpu_us_per_item"] = round(1e6 * spent / row["items"], 1) if row["items"] else None
    if triton and triton_before:
        row |= triton.since(triton_before, row["items"])
    row["gpu_util_pct"] = gpu.mean()
    return row


def gateway_env(workers: int, threads: int, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {"GATEWAY_WORKERS": str(workers), "GATEWAY_DECODE_THREADS": str(threads),
           "GATEWAY_CANARY_INTERVAL_S": "0", "GATEWAY_LOG_LEVEL": "WARNING"}  # fmt: skip
    return env | (extra or {})


@contextlib.contextmanager
def gateway(
    triton: TritonSide, env: dict[str, str], cores: tuple[int, ...], work: Path
) -> Iterator[Any]:
    """A gateway on ``triton`` as the launcher starts one: its inference calls over Triton's
    HTTP endpoint."""
    from clip_gateway.config.processes import GatewayProcess

    if int(env["GATEWAY_WORKERS"]) > 1:  # what the supervisor gives several workers
        metrics = Path(tempfile.mkdtemp(prefix="metrics-", dir=work))
        env = env | {"PROMETHEUS_MULTIPROC_DIR": str(metrics)}
    with pinned(cores), GatewayProcess(triton.grpc_url, env=env, log_path=work / "gateway.log",
                                       triton_http_url=triton.http_url or None) as gw:  # fmt: skip
        gw.wait_ready(120)
        yield gw


# -- phases ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Machine:
    """The CPUs this run may use and how they are laid out."""

    available: list[int]
    topology: Topology

    @classmethod
    def here(cls) -> Machine:
        available = sorted(os.sched_getaffinity(0))
        return cls(available, Topology.read(available))

    def split(self, share: float | None = None) -> Cores:
        return Cores.split(self.available, self.topology, share)


def calibrate(
    machine: Machine,
    cores: Cores,
    triton: TritonSide,
    env: dict[str, str],
    cell: tuple[int, int, float],
    work: Path,
) -> tuple[Cores, dict[str, Any]]:
    """A phase's first cell (``cell``: batch, clients, seconds) of uploads through a gateway of
    ``env`` on the gateway's cores of the split so far, with Triton (``triton``) already
    serving. Both sides' CPU per image give Triton's share of the cores; Triton's running
    process tree is moved onto the cores that share gives, and the new split is returned with
    the cell."""
    batch, concurrency, seconds = cell
    with gateway(triton, env, cores.gateway, work) as gw:
        row = measured(gw.url, gw.process.pid, batch, concurrency, seconds, cores, triton)
    share = triton_share(row["gateway_cpu_us_per_item"], row.get("triton_cpu_us_per_item"))
    split = machine.split(share) if share is not None else cores
    moved = pin_tree(triton.pid, split.triton)
    row |= {"workers": int(env["GATEWAY_WORKERS"]), "decode_threads":
            int(env["GATEWAY_DECODE_THREADS"]), "triton_share": None if share is None else
            round(share, 3), "cores_split": asdict(split), "pinned": split.pinned,
            "triton_threads_moved": moved}  # fmt: skip
    print(json.dumps({"calibration": {k: row.get(k) for k in (
        "gateway_cpu_us_per_item", "triton_cpu_us_per_item", "triton_share", "cores_split")}}),
        flush=True)  # fmt: skip
    return split, row


def cpu_wall(
    sweep: Sweep, machine: Machine, cores: Cores, work: Path, export_dir: Path
) -> dict[str, Any]:
    """The gateway alone (null model): images/s and CPU per image by worker count, each beside
    Triton's CPU per image."""
    from bench.harness.models import null_repository
    from clip_gateway.config.plan import worker_plan
    from clip_gateway.launcher.local import LocalTriton

    repo = null_repository(export_dir, work / "null-repo")
    size = int(json.loads((export_dir / "manifest.json").read_text())["image_size"])
    use_uploads(work, size)
    rows = []
    with pinned(cores.triton), LocalTriton(repo, log_path=work / "triton-null.log") as server:
        assert server.process is not None
        triton = TritonSide(server.process.pid, server.metrics_url, "clip_image", size * size * 3,
                            server.grpc_url, server.http_url)  # fmt: skip
        plan = worker_plan(cores.gateway_count())
        cores, calibration = calibrate(
            machine, cores, triton, gateway_env(plan.workers, plan.decode_threads),
            (32, max(4, 4 * plan.workers), sweep.calibration_seconds), work,
        )  # fmt: skip
        available = cores.gateway_count()
        settings: list[tuple[str, int, int, tuple[int, ...]]] = [
            (f"{w} worker{'s' * (w > 1)}", w, worker_plan(1, w).decode_threads,
             cores.gateway[:w]) for w in sweep.workers if w <= available
        ]  # fmt: skip
        plan = worker_plan(available)
        settings.append((f"core plan on {available} cores", plan.workers, plan.decode_threads,
                         cores.gateway))  # fmt: skip
        for name, workers, threads, gateway_cores in settings:
            env = gateway_env(workers, threads)
            with gateway(triton, env, gateway_cores, work) as gw:
                pid = gw.process.pid
                concurrency = max(4, 4 * workers)
                row = measured(gw.url, pid, 32, concurrency, sweep.wall_seconds, cores, triton)
            row |= {"name": name, "workers": workers, "decode_threads": threads,
                    "gateway_cores": len(gateway_cores) or available,
                    "gateway_cpus": list(gateway_cores)}  # fmt: skip
            busy = len(gateway_cores) or min(workers * threads, os.cpu_count() or 1)
            row |= decode_alongside(gateway_cores, busy, sweep.decode_seconds)
            rows.append(row)
            print(json.dumps({k: row.get(k) for k in ("name", "items_per_s",
                              "gateway_cpu_us_per_item", "triton_cpu_us_per_item",
                              "worker_cpu_s", "statuses")}), flush=True)  # fmt: skip
    one = next((r for r in rows if r["workers"] == 1 and r["name"].startswith("1 ")), None)
    for row in rows:
        if one and one["items_per_s"]:
            row["speedup_vs_1"] = round(row["items_per_s"] / one["items_per_s"], 2)
            row["efficiency"] = round(row["speedup_vs_1"] / row["gateway_cores"], 2)
        if one and row["gateway_cpu_us_per_item"]:  # per-image CPU against 1 worker's
            keys = ("gateway_cpu_us_per_item", "decode_only_us_per_item")
            row["growth_vs_1"] = {key: round(row[key] / one[key] - 1, 3) for key in keys}
    return {"calibration": calibration, "cores_split": asdict(cores), "rows": rows}


def engine(
    model: str,
    sweep: Sweep,
    machine: Machine,
    cores: Cores,
    work: Path,
    export_dir: Path,
    gpu: bool,
) -> dict[str, Any]:
    """The model's graphs served by Triton through the gateway: the sweep, texts, parity; the
    cores split by a first calibration cell through this engine."""
    from bench.harness.models import render
    from clip_gateway.config.plan import worker_plan
    from clip_gateway.launcher.local import LocalTriton

    manifest = json.loads((export_dir / "manifest.json").read_text())
    size = int(manifest["image_size"])
    profile, settings = "cpu", dict[str, object](max_batch_size=sweep.max_batch_size)
    if gpu:
        profile = "cuda"
        settings |= {"gpu_backend": "python", "instance_count": 2,
                     "preferred_batch_sizes": [32, 64, sweep.max_batch_size]}  # fmt: skip
    repo = render(export_dir, work / f"repo-{model}", profile, **settings)
    result: dict[str, Any] = {
        "profile": profile,
        "triton_backend": "python (ONNX Runtime CUDA EP)"
        if gpu
        else "python (ONNX Runtime CPU EP)",
        "graph": "FP16" if gpu else "FP32",
        "max_batch_size": sweep.max_batch_size,
        "instances": settings.get("instance_count", 1),
        "images": [],
        "texts": [],
    }
    use_uploads(work, size)
    started = time.perf_counter()
    with (
        pinned(cores.triton),
        LocalTriton(repo, log_path=work / f"triton-{model}.log") as server,
    ):
        assert server.process is not None
        result["triton_ready_s"] = round(time.perf_counter() - started, 1)
        triton = TritonSide(server.process.pid, server.metrics_url, "clip_image", size * size * 3,
                            server.grpc_url, server.http_url)  # fmt: skip
        plan = worker_plan(cores.gateway_count(), sweep.workers_engine, sweep.threads_engine)
        cores, result["calibration"] = calibrate(
            machine, cores, triton, gateway_env(plan.workers, plan.decode_threads),
            (sweep.calibration_batch, max(sweep.concurrency), sweep.calibration_seconds), work,
        )  # fmt: skip
        plan = worker_plan(cores.gateway_count(), sweep.workers_engine, sweep.threads_engine)
        env = gateway_env(plan.workers, plan.decode_threads)
        result["gateway"] = {"workers": plan.workers, "decode_threads": plan.decode_threads}
        result["cores_split"] = asdict(cores)
        text = replace(triton, model="clip_text", row_bytes=4 * int(manifest.get(
            "context_length", 77)))  # fmt: skip
        with gateway(triton, env, cores.gateway, work) as gw:
            pid = gw.process.pid
            result["parity"] = parity(gw.url, model, size)
            for batch in sweep.batches:
                for concurrency in sweep.concurrency:
                    row = measured(gw.url, pid, batch, concurrency, sweep.cell_seconds, cores,
                                   triton)  # fmt: skip
                    result["images"].append(row)
                    print(json.dumps({"model": model} | {k: row.get(k) for k in (
                        "batch", "concurrency", "items_per_s", "p50_ms", "p99_ms",
                        "gpu_util_pct", "gateway_cpu_us_per_item", "triton_cpu_us_per_item",
                        "triton_rows_per_execution", "triton_copies_per_row",
                        "gateway_ms_per_request", "triton_ms_per_request", "statuses")}),
                        flush=True)  # fmt: skip
            if "text" in manifest.get("towers", {}):
                for concurrency in sweep.text_concurrency:
                    row = measured(gw.url, pid, 32, concurrency, sweep.cell_seconds, cores,
                                   text, texts=True)  # fmt: skip
                    result["texts"].append(row)
    return result


def parity(url: str, model: str, size: int) -> dict[str, Any]:
    """Served image and text embeddings against open_clip FP32 on the CPU (seed-0 weights)."""
    import open_clip

    from bench.harness.clients import post
    from clip_gateway.client.core import multipart
    from clip_gateway.export.model import load
    from clip_gateway.export.parity import reference, reference_text
    from clip_gateway.model.spec import Weights

    def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:  # row by row, both float64
        found: np.ndarray = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
        return found

    files, pixels = parity_images(16, size)
    body, content_type = multipart(files, "image/png")
    # a 429 beside other work is waited out as it says (it once failed the CI rehearsal)
    response = post(f"{url}/v1/embeddings", content=body, timeout=120,
                    headers={"Content-Type": content_type})  # fmt: skip
    response.raise_for_status()
    served = np.array([row["embedding"] for row in response.json()["data"]], dtype=np.float64)
    loaded = load(model, Weights.random(0))
    image_cos = cosine(served, reference(loaded, pixels).astype(np.float64))
    found = {"images": len(files), "image_cos_min": round(float(image_cos.min()), 6),
             "image_cos_mean": round(float(image_cos.mean()), 6)}  # fmt: skip
    texts = TEXTS[:16]
    response = post(f"{url}/v1/embeddings", json={"input": texts}, timeout=120)
    if response.status_code == 200:
        served = np.array([row["embedding"] for row in response.json()["data"]], np.float64)
        tokens = open_clip.get_tokenizer(model)(texts).numpy().astype(np.int32)
        text_cos = cosine(served, reference_text(loaded, tokens).astype(np.float64))
        found |= {"texts": len(texts), "text_cos_min": round(float(text_cos.min()), 6),
                  "text_cos_mean": round(float(text_cos.mean()), 6)}  # fmt: skip
    return found


def ceilings(model: str, sweep: Sweep, export_dir: Path, gpu: bool) -> dict[str, Any]:
    """The served graph alone in ONNX Runtime, and open_clip in torch FP16 on device tensors."""
    from bench.harness import engine
    from clip_gateway.export.model import load
    from clip_gateway.model.spec import Weights

    manifest = json.loads((export_dir / "manifest.json").read_text())
    size = int(manifest["image_size"])
    path = export_dir / ("model_fp16.onnx" if gpu else "model.onnx")
    provider = "CUDAExecutionProvider" if gpu else "CPUExecutionProvider"
    session = engine.session(path, provider)
    pixels = np.random.default_rng(0).integers(0, 256, (1, size, size, 3), dtype=np.uint8)
    found: dict[str, Any] = {"provider": provider, "graph": path.name, "ort": {}}
    (pixels_input,) = session.get_inputs()  # the export's one input: uint8 pixels
    for batch in sweep.ceiling_batches:
        feed = {pixels_input.name: pixels.repeat(batch, axis=0)}
        found["ort"][str(batch)] = engine.rate(
            lambda feed=feed, s=session: s.run(None, feed), batch, sweep.ceiling_seconds
        )
    session = None  # its GPU memory back before torch takes the device
    if gpu:
        loaded = load(model, Weights.random(0))
        found["torch_fp16"] = engine.torch_fp16(
            loaded, size, tuple(b for b in sweep.ceiling_batches if b >= 32), sweep.ceiling_seconds
        )
    return found


def has_gpu() -> bool:
    """ONNX Runtime has its CUDA EP and NVML sees a GPU."""
    try:
        import onnxruntime as ort
    except ImportError:
        return False
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return False
    with GpuSampler() as sampler:
        return sampler._handle is not None


# -- the run ---------------------------------------------------------------------------------


def environment(gpu: bool, machine: Machine, cores: Cores) -> dict[str, Any]:
    """The machine's record, its CPU topology and the split before anything is measured (each
    phase's measured split is in its own results)."""
    from bench.harness.machine import imaging, record

    found = record() | {"cpu_topology": machine.topology.record(),
                        "cores_split": asdict(cores), "pinned": cores.pinned,
                        "imaging": imaging()}  # fmt: skip
    try:
        import onnxruntime as ort

        found["onnxruntime_providers"] = ort.get_available_providers()
    except ImportError:
        pass
    if gpu:
        query = "name,driver_version,memory.total,clocks.max.sm"
        found["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
            capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
    return found


@dataclass
class Run:
    sweep: Sweep
    out: Path
    cache: Path | None
    gpu: bool
    phases: tuple[str, ...] = ("wall", "engine", "ceilings")
    results: dict[str, Any] = field(default_factory=dict)

    def save(self) -> None:
        write_results(self.out, "host", self.results, markdown=markdown(self.results), plot=plot)

    def phase(self, key: str, work: Any) -> None:
        """Run one phase; a failure is recorded and the run goes on to the next."""
        started = time.perf_counter()
        try:
            self.results[key] = work()
        except Exception as exc:  # one broken phase must not cost the lent machine's others
            self.results[key] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
            print(f"phase {key} failed: {exc}", file=sys.stderr, flush=True)
        self.results.setdefault("phase_seconds", {})[key] = round(time.perf_counter() - started)
        self.save()


def run(
    sweep: Sweep, out: Path, cache: Path | None, gpu: bool, phases: tuple[str, ...]
) -> dict[str, Any]:
    from bench.harness.models import export

    machine = Machine.here()
    cores = machine.split()  # Triton's before it is measured; each phase measures its own
    state = Run(sweep, out, cache, gpu, phases)
    state.results = {"environment": environment(gpu, machine, cores), "sweep": asdict(sweep),
                     "models": {}}  # fmt: skip
    state.save()
    exports = {}
    for model in sweep.models:
        started = time.perf_counter()
        exports[model] = export(model, cache)
        state.results.setdefault("export_seconds", {})[model] = round(
            time.perf_counter() - started, 1
        )
    # the repositories and the servers' logs: $BENCH_HOST_WORK when set (the GPU kit keeps
    # them for its results), else a temporary folder
    kept = os.environ.get("BENCH_HOST_WORK")
    with contextlib.ExitStack() as stack:
        if kept:
            work = Path(kept)
            work.mkdir(parents=True, exist_ok=True)
        else:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-host-")))
        if "wall" in phases:
            state.phase("cpu_wall", lambda: cpu_wall(sweep, machine, cores, work,
                                                     exports[sweep.models[0]]))  # fmt: skip
        for model in sweep.models:
            if "engine" in phases:
                state.phase(
                    f"engine:{model}",
                    lambda m=model: engine(m, sweep, machine, cores, work, exports[m], gpu),
                )
            if "ceilings" in phases:
                state.phase(f"ceilings:{model}",
                            lambda m=model: ceilings(m, sweep, exports[m], gpu))  # fmt: skip
    return state.results


# -- report ----------------------------------------------------------------------------------


def _cell(row: dict[str, Any] | None, key: str, fmt: str = ",.0f") -> str:
    value = (row or {}).get(key)
    return "–" if value is None else format(value, fmt)


def _triton(row: dict[str, Any]) -> str:
    """Triton's CPU per image, and how much of it the server and the stubs spent."""
    if row.get("triton_cpu_us_per_item") is None:
        return "–"
    return (f"{_cell(row, 'triton_cpu_us_per_item')} ({_cell(row, 'triton_server_cpu_us_per_item')}"
            f" + {_cell(row, 'triton_stub_cpu_us_per_item')})")  # fmt: skip


def _calibration(found: dict[str, Any] | None) -> list[str]:
    """The phase's first cell and the core split it gave."""
    if not found:
        return []
    split = found.get("cores_split") or {}
    where = "not pinned (under 12 CPUs)"
    if found.get("pinned"):
        where = (f"gateway on CPUs {split.get('gateway')}, Triton on {split.get('triton')}, "
                 f"load on {split.get('load')}")  # fmt: skip
    return [f"Calibration (batch {found.get('batch')} x {found.get('concurrency')}, "
            f"{found.get('workers')} "
            f"worker(s) x {found.get('decode_threads')} threads): gateway "
            f"{_cell(found, 'gateway_cpu_us_per_item')} µs/image, Triton {_triton(found)} "
            f"µs/image: Triton's share {found.get('triton_share')}; {where}.", ""]  # fmt: skip


def _growth(rows: list[dict[str, Any]]) -> list[str]:
    parts = "; ".join(f"{r['name']}: gateway {r['growth_vs_1']['gateway_cpu_us_per_item']:+.1%}, "
                      f"decode-only {r['growth_vs_1']['decode_only_us_per_item']:+.1%}"
                      for r in rows if r.get("growth_vs_1") and r["workers"] > 1)  # fmt: skip
    return [f"Per-image CPU against 1 worker's (decode-only on the same CPUs at once: the "
            f"machine's own growth): {parts}."] if parts else []  # fmt: skip


def _gateway_stages(ms: dict[str, float] | None) -> str:
    """The gateway's milliseconds per request (Server-Timing): ``decode, Triton call``."""
    return "–" if not ms else ", ".join(f"{ms[stage]:.1f}" for stage in SERVER_STAGES)


def _stages(ms: dict[str, float] | None) -> str:
    """Triton's milliseconds per request: ``all (queue + input/infer/output)``."""
    if not ms or "request" not in ms:
        return "–"
    parts = "/".join(f"{ms[stage]:.1f}" for stage in ("input", "infer", "output") if stage in ms)
    return f"{ms['request']:.1f} ({ms.get('queue', 0.0):.1f} + {parts})"


def _engine_section(model: str, found: dict[str, Any], ceiling: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    if "error" in found:
        return [f"## {model}: engine phase failed", "", f"`{found['error']}`", ""]
    lines += [f"## {model} through the gateway ({found['triton_backend']}, {found['graph']})",
              "", f"Triton max batch {found['max_batch_size']}, {found['instances']} "
              f"instances; gateway {found['gateway']}; parity vs open_clip FP32: "
              f"{found.get('parity')}.", "", *_calibration(found.get("calibration")),
              "| batch | clients | images/s | p50 ms | p99 ms | GPU util % | "
              "gateway CPU µs/image | Triton CPU µs/image (server + stubs) | rows/execution | "
              "gateway ms/request: decode, Triton call | "
              "Triton ms/request: all (queue + in/infer/out) | "
              "copies/row in model.py | graph alone (ORT) images/s | statuses |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for row in found["images"]:
        alone = (ceiling.get("ort") or {}).get(str(row["batch"]))
        lines.append(f"| {row['batch']} | {row['concurrency']} | {_cell(row, 'items_per_s')} | "
                     f"{_cell(row, 'p50_ms', '.1f')} | {_cell(row, 'p99_ms', '.1f')} | "
                     f"{_cell(row, 'gpu_util_pct', '.0f')} | "
                     f"{_cell(row, 'gateway_cpu_us_per_item')} | {_triton(row)} | "
                     f"{_cell(row, 'triton_rows_per_execution', '.1f')} | "
                     f"{_gateway_stages(row.get('gateway_ms_per_request'))} | "
                     f"{_stages(row.get('triton_ms_per_request'))} | "
                     f"{_cell(row, 'triton_copies_per_row', '.2f')} | "
                     f"{_cell(alone, 'items_per_s')} | {row['statuses']} |")  # fmt: skip
    pinned = {row.get("triton_buffer_pinned") for row in found["images"]} - {None}
    if pinned:
        lines.append(f"\nmodel.py's batch buffer page-locked: {sorted(pinned)}.")
    if asleep := {row.get("triton_blocking_sync") for row in found["images"]} - {None}:
        lines.append(f"\nThe CUDA context waits for the GPU asleep: {sorted(asleep)}.")
    for row in found.get("texts", []):
        lines.append(f"\nTexts, batch 32 x {row['concurrency']} clients: "
                     f"{_cell(row, 'items_per_s')} texts/s, p50 {_cell(row, 'p50_ms', '.1f')} "
                     f"ms, {row['statuses']}.")  # fmt: skip
    if ceiling and "error" not in ceiling:
        ort_rates = ", ".join(f"{b}: {r['items_per_s']:,.0f}" for b, r in ceiling["ort"].items())
        lines += ["", f"Ceilings: {ceiling['graph']} alone in ONNX Runtime "
                  f"({ceiling['provider']}), images/s by batch: {ort_rates}."]  # fmt: skip
        if torch_rates := ceiling.get("torch_fp16"):
            rates = ", ".join(f"{b}: {r['items_per_s']:,.0f}" for b, r in torch_rates.items())
            lines.append(f"open_clip in torch FP16 on device tensors: {rates}.")
    elif ceiling:
        lines += ["", f"Ceilings failed: `{ceiling['error']}`"]
    best = max(found["images"], key=lambda r: r.get("items_per_s") or 0, default=None)
    alone = (ceiling.get("ort") or {}).get(str(best["batch"])) if best else None
    if best and alone:
        lines += ["", f"Best through the gateway: {best['items_per_s']:,.0f} images/s (batch "
                  f"{best['batch']} x {best['concurrency']}): "
                  f"{best['items_per_s'] / alone['items_per_s']:.2f}x the graph alone at "
                  f"batch {best['batch']}."]  # fmt: skip
    lines.append("")
    return lines


def markdown(results: dict[str, Any]) -> str:
    env = results.get("environment", {})
    lines = ["# One host end to end: gateway → Triton → engine", "",
             f"Machine: {env.get('cpu')} ({env.get('cores')} cores), GPU: "
             f"{env.get('nvidia_smi') or env.get('gpu') or 'none'}; Python {env.get('python')}, "
             f"{env.get('versions')}; imaging: {env.get('imaging')}; CPU topology: "
             f"{env.get('cpu_topology')}; cores pinned: {env.get('pinned')} (each phase's "
             f"split below); commit {env.get('git_commit')}, {env.get('when')}.", ""]  # fmt: skip
    wall = results.get("cpu_wall", {})
    if wall.get("rows"):
        lines += ["## CPU wall: the gateway alone (null model), uploads at batch 32", "",
                  *_calibration(wall.get("calibration")),
                  "| gateway | cores | decode threads/worker | images/s | CPU µs/image | "
                  "decode-only µs/image, as many at once | gateway ÷ decode-only | "
                  "Triton CPU µs/image (server + stubs) | speed-up vs 1 | per-core efficiency | "
                  "statuses |", "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for row in wall["rows"]:
            lines.append(f"| {row['name']} | {row['gateway_cores']} | {row['decode_threads']} | "
                         f"{_cell(row, 'items_per_s')} | {_cell(row, 'gateway_cpu_us_per_item')} | "
                         f"{_cell(row, 'decode_only_us_per_item', '.1f')} | "
                         f"{row['gateway_cpu_us_per_item'] / row['decode_only_us_per_item']:.2f} | "
                         f"{_triton(row)} | {_cell(row, 'speedup_vs_1', '.2f')} | "
                         f"{_cell(row, 'efficiency', '.2f')} | {row['statuses']} |")  # fmt: skip
        lines += ["", *_growth(wall["rows"]), ""]
    elif wall:
        lines += [f"CPU wall: {wall}", ""]
    for key, found in results.items():
        if key.startswith("engine:"):
            model = key.split(":", 1)[1]
            lines += _engine_section(model, found, results.get(f"ceilings:{model}", {}))
    lines += [f"Phase seconds: {results.get('phase_seconds')}; exports: "
              f"{results.get('export_seconds')}.", ""]  # fmt: skip
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> None:
    with figure(path, dpi=110, ncols=2, figsize=(11, 4)) as (_, axes):
        rows = results.get("cpu_wall", {}).get("rows", [])
        workers = [r for r in rows if not r["name"].startswith("core plan")]
        if workers:
            axes[0].plot([r["workers"] for r in workers], [r["items_per_s"] for r in workers],
                         marker="o", label="measured")  # fmt: skip
            one = workers[0]["items_per_s"]
            axes[0].plot([r["workers"] for r in workers], [one * r["workers"] for r in workers],
                         linestyle="--", label="linear")  # fmt: skip
        axes[0].set(xlabel="gateway workers (1 core each)", ylabel="images/s",
                    title="CPU wall (null model)")  # fmt: skip
        axes[0].grid(True, alpha=0.3)
        if workers:
            axes[0].legend(fontsize=8)
        for key, found in results.items():
            if key.startswith("engine:") and "images" in found:
                for batch in sorted({r["batch"] for r in found["images"]}):
                    cells = [r for r in found["images"] if r["batch"] == batch]
                    axes[1].plot([r["concurrency"] for r in cells],
                                 [r["items_per_s"] for r in cells], marker="o",
                                 label=f"{key.split(':')[1]} batch {batch}")  # fmt: skip
        axes[1].set(xlabel="clients", ylabel="images/s", title="Through the gateway")
        axes[1].set_xscale("log", base=2)
        axes[1].grid(True, alpha=0.3)
        if axes[1].get_legend_handles_labels()[0]:
            axes[1].legend(fontsize=7)


def child(argv: list[str]) -> int:
    """``python -m bench.harness.child host load URL BATCH CLIENTS SECONDS images|texts``: one
    load process; ``... host decode SECONDS``: one decode-only process (``decode_alongside``)."""
    if argv[:1] == ["load"]:
        url, batch, concurrency, seconds, kind = argv[1:6]
        asyncio.run(_load(url, int(batch), int(concurrency), float(seconds), kind == "texts"))
        return 0
    if argv[:1] == ["decode"] and len(argv) == 2:  # decode_alongside's: µs per upload
        images = pickle.loads(Path(os.environ["BENCH_HOST_UPLOADS"]).read_bytes())  # use_uploads
        print(1e6 / per_cpu_second_for(simplejpeg.decode_jpeg, images, float(argv[1])))
        return 0
    print(child.__doc__, file=sys.stderr)
    return 2


def main(argv: list[str]) -> int:
    parser = study.parser("host", __doc__, smoke="a small sweep: CI's rehearsal")
    parser.add_argument(
        "--provider", choices=("auto", "cuda", "cpu"), default="auto",
        help="auto: cuda where ONNX Runtime has its CUDA EP and a GPU answers, else cpu",
    )  # fmt: skip
    parser.add_argument("--phases", nargs="+", default=["wall", "engine", "ceilings"],
                        choices=("wall", "engine", "ceilings"))  # fmt: skip
    parser.add_argument("--models", nargs="+", default=None, help="default: the sweep's")
    parser.add_argument("--batches", nargs="+", type=int, default=None, help="default: the sweep's")
    parser.add_argument("--clients", nargs="+", type=int, default=None, help="default: the sweep's")
    parser.add_argument(
        "--workers", type=int, default=0, help="the engine phase's gateway workers (0: core plan)"
    )
    parser.add_argument("--decode-threads", type=int, default=0, help="per worker (0: core plan)")
    parser.add_argument("--cache-dir", type=Path, default=None, help="default: the export cache")
    args = parser.parse_args(argv)
    gpu = args.provider == "cuda" or (args.provider == "auto" and has_gpu())
    sweep = SMOKE if args.smoke else FULL
    for name, value in (("models", args.models), ("batches", args.batches),
                        ("concurrency", args.clients)):  # fmt: skip
        if value:
            chosen: dict[str, Any] = {name: tuple(value)}
            sweep = replace(sweep, **chosen)
    sweep = replace(sweep, workers_engine=args.workers, threads_engine=args.decode_threads)
    out = study.out(args, "host")
    results = run(sweep, out, args.cache_dir, gpu, tuple(args.phases))
    print(out, flush=True)
    failed = [key for key, found in results.items() if isinstance(found, dict) and "error" in found]
    if failed:
        print(f"error: phases failed: {failed}", file=sys.stderr)
    return 1 if failed else 0
