"""``python -m bench run``: every system on loopback, the same weights, one run, one report.

Order: export (cached) → model repositories → decode micro-benchmark → cold starts → for each
system a driver process runs single-image, batch and concurrency phases → null-model capacity of
one gateway core (with a py-spy profile) → gRPC vs system shared memory → JSON, Markdown, PNGs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.harness import models, profiling
from bench.harness.clients import tensor_json_bytes
from bench.harness.machine import record as machine
from bench.harness.pillow import stock_pillow, with_stock_pillow
from bench.studies import shm
from bench.studies.suites import SUITES, Suite
from clip_gateway.config.processes import GatewayProcess, ReservedPort, ServerProcess, reserve_port
from clip_gateway.export.build import ensure_exported
from clip_gateway.launcher.local import LocalTriton
from clip_gateway.model.spec import ExportedModel, Weights, default_cache_dir

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class PytorchBaseline(ServerProcess):
    """Baseline A's server process (stock Pillow first on its path)."""

    stock_pillow: Path | None = None
    port: int = 0
    reservation: ReservedPort | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "bench.baselines.pytorch_fastapi", "--port", str(self.port)]

    def environment(self) -> dict[str, str]:
        return with_stock_pillow(self.stock_pillow)

    def start(self, timeout: float = 180.0) -> PytorchBaseline:
        if not self.port:
            self.reservation = reserve_port()
            self.port = self.reservation.port
        self.launch()
        self.wait_for(f"{self.url}/health", timeout, "pytorch baseline", stop_on_timeout=True)
        return self


def phases(suite: Suite, system: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"name": "single", "batch": 1, "count": suite.single_count, "warmup": suite.single_warmup}
    ]
    out += [
        {"name": f"batch-{b}", "batch": b, "count": suite.batch_count, "warmup": 1}
        for b in suite.batches
    ]
    if system in suite.sweep_systems:
        out += [
            {
                "name": f"conc-{c}",
                "batch": 1,
                "concurrency": c,
                "duration": suite.point_seconds,
                "warmup": 1,
            }
            for c in suite.concurrency
        ]
    return out


def drive(plan: dict[str, Any], work: Path, env: dict[str, str], cpus: str | None = None) -> Any:
    plan_path = work / f"plan-{plan['system']}-{time.monotonic_ns()}.json"
    out_path = plan_path.with_suffix(".out.json")
    plan_path.write_text(json.dumps(plan))
    pin = ["taskset", "-c", cpus] if cpus else []
    command = [*pin, sys.executable, "-m", "bench.harness.drive", str(plan_path), str(out_path)]
    subprocess.run(command, env=env, check=True, cwd=ROOT)
    return json.loads(out_path.read_text())


def decode_benchmark(suite: Suite, stock: Path | None) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    args = [
        "--min-seconds",
        str(suite.decode_seconds),
        *(["--full"] if suite.decode_full_sets else []),
    ]
    for pipeline, env in (
        ("naive", with_stock_pillow(stock)),
        ("gateway", with_stock_pillow(None)),
    ):
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "bench.harness.child",
                    "decode",
                    "--pipeline",
                    pipeline,
                    *args,
                    "--json",
                    out.name,
                ],
                env=env,
                check=True,
                cwd=ROOT,
                capture_output=True,
            )
            rows += json.loads(Path(out.name).read_text())
    return rows


def run(suite_name: str, out_dir: Path, profile: str = "cpu") -> dict[str, Any]:
    suite = SUITES[suite_name]
    out_dir.mkdir(parents=True, exist_ok=True)
    cache = default_cache_dir()
    started = time.monotonic()
    log = _logger(started)
    exported = ensure_exported("ViT-B-32", Weights.random(0))
    stock = stock_pillow(cache)
    results: dict[str, Any] = {"suite": suite_name, "machine": machine(), "profile": profile}
    results["suite_settings"] = asdict(suite)
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        work = Path(tmp)
        repo = models.bench_repository(exported.directory, work / "repo", profile)
        manifest = exported.manifest
        raw_delta = models.check_raw_equivalence(
            exported.fp32,
            repo / models.RAW_MODEL / "1" / models.RAW_FILE,
            manifest["mean"],
            manifest["std"],
        )
        results["raw_model_max_abs_delta"] = raw_delta
        log(f"baseline B's raw model = ours to max |Δ| {raw_delta:.2e}")
        results["decode"] = decode_benchmark(suite, stock)
        log("decode micro-benchmark done")
        results.update(_systems(suite, work, repo, stock, log))
        results["null_model"] = _null_capacity(suite, work, exported, out_dir, log)
        results["shared_memory"] = shm.compare(
            {"ViT-B/32": repo, "null model": work / "null-repo"}, work, suite.shm_calls
        )
        log("shared-memory comparison done")
    results["payload"] = _payload(results)
    results["wall_seconds"] = round(time.monotonic() - started, 1)
    from bench.studies import report

    report.write(results, out_dir)
    log(f"results in {out_dir}")
    return results


def _systems(suite: Suite, work: Path, repo: Path, stock: Path | None, log: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"systems": {}, "cold_start_s": {}}
    gateway_env = with_stock_pillow(None)
    baseline_env = with_stock_pillow(stock)
    t0 = time.monotonic()
    with LocalTriton(repo, log_path=work / "triton.log") as triton:
        out["cold_start_s"]["triton"] = round(time.monotonic() - t0, 2)
        t1 = time.monotonic()
        gateway = GatewayProcess(
            triton.grpc_url,
            env={"GATEWAY_TRITON_METRICS_URL": triton.metrics_url},
            log_path=work / "gateway.log",
        )
        with gateway:
            gateway.wait_ready()
            out["cold_start_s"]["gateway_after_triton"] = round(time.monotonic() - t1, 2)
            targets = {
                "gateway": (gateway.url, "clip_image", gateway_env),
                "gateway-json": (gateway.url, "clip_image", gateway_env),
                "triton-grpc": (triton.grpc_url, models.RAW_MODEL, baseline_env),
                "triton-http": (
                    triton.http_url.removeprefix("http://"),
                    models.RAW_MODEL,
                    baseline_env,
                ),
            }
            for system, (url, model, env) in targets.items():
                plan = {
                    "system": system,
                    "url": url,
                    "triton_metrics_url": triton.metrics_url,
                    "triton_model": model,
                    "distinct_images": suite.distinct_images,
                    "phases": phases(suite, system),
                }
                out["systems"][system] = drive(plan, work, env)
                log(f"{system} done")
        t2 = time.monotonic()
        with PytorchBaseline(stock_pillow=stock, log_path=work / "pytorch.log") as baseline:
            out["cold_start_s"]["pytorch"] = round(time.monotonic() - t2, 2)
            plan = {
                "system": "pytorch",
                "url": baseline.url,
                "distinct_images": suite.distinct_images,
                "phases": phases(suite, "pytorch"),
            }
            out["systems"]["pytorch"] = drive(plan, work, baseline_env)
            log("pytorch done")
    return out


def _null_capacity(
    suite: Suite, work: Path, exported: ExportedModel, out_dir: Path, log: Any
) -> dict[str, Any]:
    """img/s of one gateway core on compact JPEGs, Triton answering with a null model.

    With two or more CPUs the gateway is pinned to CPU 0 (one decode thread, one worker) and
    Triton plus the load generator to the others, so the figure is what one gateway core does.
    """
    cpus = sorted(os.sched_getaffinity(0))
    gateway_cpu = frozenset(cpus[:1]) if len(cpus) > 1 else None
    rest = ",".join(map(str, cpus[1:])) if len(cpus) > 1 else None
    repo = models.null_repository(exported.directory, work / "null-repo")
    result: dict[str, Any] = {"pinned": gateway_cpu is not None}
    with LocalTriton(
        repo, log_path=work / "null-triton.log", cpus=frozenset(cpus[1:]) if rest else None
    ) as triton:
        env = {"GATEWAY_DECODE_THREADS": "1", "GATEWAY_CANARY_INTERVAL_S": "0"}
        with GatewayProcess(
            triton.grpc_url, env=env, log_path=work / "null-gateway.log", cpus=gateway_cpu
        ) as gateway:
            gateway.wait_ready()
            for batch, concurrency in ((32, 4), (1, 16)):
                plan = {
                    "system": "gateway",
                    "url": gateway.url,
                    "triton_metrics_url": triton.metrics_url,
                    "distinct_images": 64,
                    "phases": [
                        {
                            "name": "null",
                            "batch": batch,
                            "concurrency": concurrency,
                            "duration": suite.null_seconds,
                            "warmup": 2,
                        }
                    ],
                }
                spy = profiling.start(gateway, suite.null_seconds + 3) if batch == 32 else None
                phase = drive(plan, work, with_stock_pillow(None), rest)["phases"]["null"]
                result[f"batch_{batch}"] = phase
                if spy is not None:
                    result["profile"] = profiling.finish(spy, out_dir / "profile-gateway-null.txt")
    log("null-model capacity done")
    return result


def _payload(results: dict[str, Any]) -> dict[str, Any]:
    def sent(system: str) -> float | None:
        phase = results["systems"].get(system, {}).get("phases", {}).get("batch-1", {})
        sent_bytes: float | None = phase.get("sent_bytes_per_image")
        return sent_bytes

    return {
        "client_to_server_bytes_per_image": {
            "gateway (multipart JPEG)": sent("gateway"),
            "pytorch (base64 JPEG in JSON)": sent("pytorch"),
            "triton-grpc (FP32 NCHW)": sent("triton-grpc"),
            "triton-http (FP32 NCHW, binary)": sent("triton-http"),
            "triton JSON .tolist() (FP32)": tensor_json_bytes(),
        },
        "gateway_to_triton_bytes_per_image": 224 * 224 * 3,
    }


def _logger(started: float) -> Any:
    def log(message: str) -> None:
        print(f"[{time.monotonic() - started:6.1f} s] {message}", flush=True)

    return log
