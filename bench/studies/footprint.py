"""``python -m bench footprint``: memory of each process the real launch path starts.

Runs ``clip-gateway serve --weights random`` (what ``make serve`` runs), warms it with compact
JPEG requests, then reads VmRSS of every process in its tree and whether any maps libtorch: the
serving processes must stay lean (torch only ever loads in the exporter's own process).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

from bench.harness import study
from bench.harness.cpu import tree
from bench.harness.output import write_results
from bench.harness.photos import compact_jpeg
from bench.harness.systems import switched, wait_http
from clip_gateway.client.core import send
from clip_gateway.config.processes import reserve_port

#: The per-worker target (issue: warm-start serving process <= 250 MB RSS).
TARGET_MB = 250


def describe(pid: int) -> dict[str, Any]:
    status = Path(f"/proc/{pid}/status").read_text()
    rss_kb = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS")))
    command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    maps = Path(f"/proc/{pid}/maps").read_text()
    role = "supervisor"
    if "resource_tracker" in command:
        role = "shared-memory resource tracker (of the gateway)"
    elif "clip_gateway.http" in command:
        role = "gateway (serving process)"
    elif "backend_stub" in command:
        role = "triton python-backend stub (ONNX Runtime)"
    elif "tritonserver" in command:
        role = "tritonserver"
    return {
        "pid": pid,
        "role": role,
        "rss_mb": round(rss_kb / 1024, 1),
        "torch": "libtorch" in maps,
    }


def run(minutes: float, out: Path, smoke: bool = False) -> dict[str, Any]:
    requests = 20 if smoke else 200
    reserved = reserve_port()
    port = reserved.port
    with tempfile.TemporaryDirectory(prefix="bench-footprint-") as work:
        reserved.release()  # the supervisor binds it now
        command = [sys.executable, "-m", "clip_gateway", "serve", "--weights", "random",
                   "--port", str(port), "--log-file", str(Path(work) / "serve.log")]  # fmt: skip
        # a smoke need not time auto's candidates for long: what serves after is what is measured
        env = os.environ | ({"GATEWAY_AUTO_MEASURE_S": "20"} if smoke else {})
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   env=env)  # fmt: skip
        try:
            url = f"http://127.0.0.1:{port}"
            wait_http(f"{url}/readyz", process, Path(work) / "serve.log", timeout=600)
            # auto's first start serves at once and quantizes, builds and times the CPU profiles
            # in child processes (the exporter among them, with torch): the footprint is the
            # one that stays, once it serves its choice
            switched(url, 1500)
            files = [("image", (f"{i}.jpg", compact_jpeg(i), "image/jpeg")) for i in range(8)]
            with httpx.Client(base_url=url, timeout=120) as http:
                for _ in range(requests):  # a 429 waited out as it says: memory is measured
                    send(lambda: http.post("/v1/embeddings", files=files)).raise_for_status()
            processes = [describe(pid) for pid in tree(process.pid)]
        finally:
            process.terminate()
            process.wait(120)
    serving = [p for p in processes if p["role"].startswith("gateway")]
    results = {
        "requests": requests,
        "images_per_request": 8,
        "processes": processes,
        "serving_rss_mb": max(p["rss_mb"] for p in serving),
        "target_mb": TARGET_MB,
        "torch_loaded_anywhere": any(p["torch"] for p in processes),
        "machine": {"cpus": os.cpu_count()},
    }
    rows = ["# Footprint of `clip-gateway serve` (the make serve path), warm", "",
            f"After {requests} requests of 8 compact JPEGs. Target: serving process <= "
            f"{TARGET_MB} MB RSS per worker; torch in no serving process.", "",
            "| process | RSS MB | libtorch mapped |", "| --- | --- | --- |"]  # fmt: skip
    rows += [
        f"| {p['role']} | {p['rss_mb']} | {'yes' if p['torch'] else 'no'} |" for p in processes
    ]
    write_results(out, "footprint", results, markdown="\n".join(rows) + "\n")
    return results


def main(argv: list[str]) -> int:
    parser = study.parser("footprint", __doc__, smoke="seconds, for CI")
    parser.add_argument("--minutes", type=float, default=1.0)
    args = parser.parse_args(argv)
    out = study.out(args, "footprint")
    return study.checked(out, run(args.minutes, out, args.smoke))
