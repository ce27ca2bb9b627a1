"""``python -m bench rolling-restart`` (`make compose-test`): deploy/compose (two gateways +
nginx) under podman-compose on the local images, steady load through nginx, and a rolling
restart of one gateway in the middle of it: requests sent, answered, failed, and latency
percentiles before, during and after the restart, to bench/results/compose/.

The compose file is the repository's, rendered with the changes this machine needs, and only
those (``render``): the local image tags, and no GPU reservation or ``host-gateway`` alias
(podman 4.3 has neither). Traffic goes to 127.0.0.1 only, bounded in count and time.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.harness import study
from bench.harness.output import figure, write_results
from bench.harness.photos import compact_jpeg

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "deploy" / "compose"
PROJECT = "clip-gateway-compose-test"
KEY = "compose-test-key-0123456789"
os.environ.setdefault("CONTAINERS_CONF", str(ROOT / "deploy" / "image" / "containers.conf"))


def interpolate(value: str) -> str:
    """Compose's ``${NAME}`` / ``${NAME:-default}`` from this process's environment."""

    def one(match: re.Match[str]) -> str:
        return os.environ.get(match.group(1)) or (match.group(3) or "")

    return re.sub(r"\$\{(\w+)(:-([^}]*))?\}", one, value)


def render(work: Path, image: str, lb_image: str, port: int) -> Path:
    """deploy/compose/docker-compose.yml for this machine, beside its own copies of the nginx
    config and an API key file (0644 in a 0755 directory: the image's user reads it)."""
    doc: dict[str, Any] = yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())
    secrets = work / "secrets"
    secrets.mkdir(parents=True, exist_ok=True)
    secrets.chmod(0o755)
    keys = secrets / "api-keys"
    keys.write_text(KEY + "\n")
    keys.chmod(0o644)
    (work / "nginx.conf").write_text((COMPOSE / "nginx.conf").read_text())
    (work / "nginx.conf").chmod(0o644)
    for name, service in doc["services"].items():
        # podman-compose 1.0.3 passes `${NAME:-}` (an empty default) through literally: the
        # gateways got OTEL_EXPORTER_OTLP_ENDPOINT="${OTEL_EXPORTER_OTLP_ENDPOINT:-}", and Triton
        # aborted on the first sampled request. Compose's own interpolation, done here:
        service["environment"] = {
            key: interpolate(str(value)) for key, value in service.get("environment", {}).items()
        }
        if name.startswith("gateway-"):
            service["image"] = image
            service.pop("build", None)
            service.pop("extra_hosts", None)  # host-gateway: podman >= 4.7
            service.pop("deploy", None)  # the GPU reservation: no GPU here
            service["cpus"] = 1  # two gateways share this machine's cores
        else:
            service["image"] = lb_image
            service["ports"] = [f"127.0.0.1:{port}:8000"]
    doc["secrets"]["api_keys"]["file"] = str(keys)
    path = work / "docker-compose.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def compose(path: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman-compose", "-p", PROJECT, "-f", str(path), *args],
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def podman(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout,
                          check=False)  # fmt: skip


def container(service: str) -> str:
    names = podman("ps", "-a", "--format", "{{.Names}}").stdout.split()
    (name,) = [n for n in names if n.startswith(PROJECT) and service in n]
    return name


def ready(name: str, timeout: float) -> float:
    """Seconds until the container's gateway answers /readyz (from inside: no published port)."""
    started = time.monotonic()
    check = "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/readyz', timeout=2)"
    probe = ["exec", name, "/opt/venv/bin/python", "-c", check]
    while time.monotonic() - started < timeout:
        if podman(*probe, timeout=30).returncode == 0:
            return time.monotonic() - started
        time.sleep(1)
    raise TimeoutError(f"{name} not ready within {timeout:.0f} s")


class Load:
    """``clients`` threads posting one small JPEG each, back to back, until stopped."""

    def __init__(self, url: str, clients: int, limit: int) -> None:
        self.url, self.clients, self.limit = url, clients, limit
        self.stop = threading.Event()
        self.rows: list[tuple[float, float, int]] = []  # start, latency, status (0: no answer)
        self.lock = threading.Lock()
        self.image = compact_jpeg(7)

    def run_client(self) -> None:
        headers = {"Authorization": f"Bearer {KEY}"}
        with httpx.Client(base_url=self.url, headers=headers, timeout=60) as http:
            while not self.stop.is_set():
                with self.lock:
                    if len(self.rows) >= self.limit:
                        return
                started = time.monotonic()
                try:
                    files = [("image", ("a.jpg", self.image, "image/jpeg"))]
                    status = http.post("/v1/embeddings", files=files).status_code
                except httpx.HTTPError:
                    status = 0
                with self.lock:
                    self.rows.append((started, time.monotonic() - started, status))

    def __enter__(self) -> Load:
        self.threads = [threading.Thread(target=self.run_client) for _ in range(self.clients)]
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join()


def summary(rows: list[tuple[float, float, int]]) -> dict[str, Any]:
    latencies = sorted(latency for _, latency, status in rows if status == 200)

    def pct(q: float) -> float | None:
        if not latencies:
            return None
        return round(1000 * latencies[min(len(latencies) - 1, int(q * len(latencies)))], 1)

    return {
        "sent": len(rows),
        "answered": sum(1 for *_, status in rows if status == 200),
        "failed": sum(1 for *_, status in rows if status != 200),
        "statuses": {str(s): sum(1 for *_, t in rows if t == s) for s in {r[2] for r in rows}},
        "p50_ms": pct(0.50),
        "p95_ms": pct(0.95),
        "max_ms": round(1000 * max(latencies), 1) if latencies else None,
        "mean_ms": round(1000 * statistics.fmean(latencies), 1) if latencies else None,
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    work = ROOT / "build" / "image" / "compose"
    path = render(work, args.image, args.lb_image, args.port)
    compose(path, "down", "-v", "-t", "5")
    up = compose(path, "up", "-d", "--no-build")
    if up.returncode != 0:
        raise RuntimeError(f"podman-compose up failed:\n{up.stdout[-3000:]}\n{up.stderr[-3000:]}")
    try:
        names = {service: container(service) for service in ("gateway-0", "gateway-1", "lb")}
        started = {s: round(ready(names[s], args.startup_s), 1) for s in ("gateway-0", "gateway-1")}
        url = f"http://127.0.0.1:{args.port}"
        with Load(url, args.clients, args.max_requests) as load:
            time.sleep(args.warm_s)
            restart_begin = time.monotonic()
            # rolling: one gateway stopped (SIGTERM: it drains) and started again; the other serves
            stop = podman("stop", "-t", "60", names["gateway-0"], timeout=120)
            stopped = time.monotonic()
            podman("start", names["gateway-0"])
            back = ready(names["gateway-0"], args.startup_s)
            if args.reload_lb:  # docs/DEPLOY.md's procedure: nginx resolves the names again
                podman("exec", names["lb"], "nginx", "-s", "reload")
            restart_end = time.monotonic()
            time.sleep(args.warm_s)
        rows = sorted(load.rows)
        phases = {
            "before": [r for r in rows if r[0] < restart_begin],
            "during": [r for r in rows if restart_begin <= r[0] < restart_end],
            "after": [r for r in rows if r[0] >= restart_end],
        }
        return {
            "clients": args.clients,
            "reload_lb": args.reload_lb,
            "ready_s": started,
            "restart": {
                "stop_exit_ok": stop.returncode == 0,
                "stop_s": round(stopped - restart_begin, 1),
                "ready_again_s": round(back, 1),
                "window_s": round(restart_end - restart_begin, 1),
            },
            "all": summary(rows),
            **{name: summary(part) for name, part in phases.items()},
            "timeline": [(round(s - rows[0][0], 3), round(lat, 4), st) for s, lat, st in rows],
            "restart_window": [
                round(restart_begin - rows[0][0], 2),
                round(restart_end - rows[0][0], 2),
            ],
        }
    finally:
        compose(path, "down", "-v", "-t", "70", timeout=300)


def stem(results: dict[str, Any]) -> str:
    return "rolling-restart-reload" if results["reload_lb"] else "rolling-restart"


def write(results: dict[str, Any], out: Path) -> None:
    # compact JSON: the timeline holds a point per request
    write_results(out, stem(results), results, markdown=markdown(results), plot=plot, indent=None)


def markdown(results: dict[str, Any]) -> str:
    procedure = ", then `nginx -s reload` in the lb" if results["reload_lb"] else ""
    lines = [
        "# Rolling restart of one gateway under steady load (deploy/compose, podman-compose)",
        "",
        f"{results['clients']} clients through nginx, one small JPEG per request, back to back; "
        f"gateway-0 stopped (SIGTERM, drain) and started again{procedure} while gateway-1 "
        "serves. Restart "
        f"window {results['restart']['window_s']} s (stop {results['restart']['stop_s']} s, "
        f"ready again after {results['restart']['ready_again_s']} s).",
        "",
        "| phase | sent | answered | failed | p50 ms | p95 ms | max ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for phase in ("before", "during", "after", "all"):
        row = results[phase]
        lines.append(f"| {phase} | {row['sent']} | {row['answered']} | {row['failed']} | "
                     f"{row['p50_ms']} | {row['p95_ms']} | {row['max_ms']} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], path: Path) -> None:
    timeline = results["timeline"]
    ok = [(t, 1000 * lat) for t, lat, status in timeline if status == 200]
    bad = [(t, 1000 * lat) for t, lat, status in timeline if status != 200]
    with figure(path, figsize=(8, 3.5)) as (_, axes):
        axes.scatter(*zip(*ok, strict=True), s=3, label="200") if ok else None
        axes.scatter(*zip(*bad, strict=True), s=12, c="red", label="failed") if bad else None
        window = results["restart_window"]
        axes.axvspan(*window, color="orange", alpha=0.2, label="gateway-0 restart")
        axes.set_xlabel("time (s)")
        axes.set_ylabel("latency (ms)")
        axes.set_title("Requests through nginx during a rolling restart")
        axes.legend(loc="upper right")


def main(argv: list[str]) -> int:
    parser = study.parser("rolling-restart", __doc__)
    parser.add_argument("--image", default="clip-gateway:local")
    parser.add_argument("--lb-image", default="localhost/clip-gateway-base/nginx:standin")
    parser.add_argument("--port", type=int, default=18000)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--warm-s", type=float, default=10.0)
    parser.add_argument("--startup-s", type=float, default=600.0)
    parser.add_argument("--max-requests", type=int, default=50_000)
    parser.add_argument(
        "--reload-lb", action="store_true", help="nginx -s reload once the gateway is back"
    )
    args = parser.parse_args(argv)
    results = measure(args)
    out = study.out(args, "compose")
    write(results, out)
    print((out / f"{stem(results)}.md").read_text())
    return 0 if results["all"]["failed"] == 0 else 1
