"""``python -m bench attacks``: the hostile classes of issue 23 against a real gateway, one at a
time, then beside normal clients.

The stack: a real tritonserver serving the control model (tests/controlled.py: the gateway's own
work is what is measured here, decode and admission, not a model's) and the real gateway
process with 2 decode threads. For each class: the statuses, the wall time of the slowest
answer, the CPU seconds the gateway process spent, its peak RSS (sampled every 5 ms from /proc)
and its RSS 10 s after the class ended. The mixed run: 4 normal clients (one compact JPEG per
request, closed loop) alone, then beside one hostile client looping over a class; their success
rate and p95.

``--gateway-path DIR`` runs the gateway from another source tree (the code before a change),
with this tree's classes and harness: run it from that directory (``python -m`` puts the working
directory first on the path) with ``PYTHONPATH`` set to this tree. Writes attacks.json;
``--render before.json after.json`` writes attacks.md and attacks.png from two runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from bench.harness.output import figure, write_results
from bench.harness.photos import CAMERA_SIZES, jpeg, photo
from clip_gateway.config.processes import GatewayProcess
from clip_gateway.launcher.local import LocalTriton
from tests import hostile, samples

TICKS = os.sysconf("SC_CLK_TCK")
#: Two API keys: the normal clients' and the hostile client's (admission's fair shares).
NORMAL_KEY, HOSTILE_KEY = "normal-clients-key", "hostile-client-key"


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
    return 0.0


@contextmanager
def sampled(pid: int) -> Iterator[dict[str, float]]:
    found = {"start_rss": rss_mb(pid), "peak_rss": rss_mb(pid), "start_cpu": cpu_s(pid)}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.005):
            found["peak_rss"] = max(found["peak_rss"], rss_mb(pid))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    started = time.monotonic()
    try:
        yield found
    finally:
        stop.set()
        thread.join()
        found["wall_s"] = time.monotonic() - started
        found["cpu_s"] = cpu_s(pid) - found["start_cpu"]
        found["peak_rss"] = max(found["peak_rss"], rss_mb(pid))


def files(images: list[bytes]) -> list[tuple[str, tuple[str, bytes, str]]]:
    return [("image", (f"{i}.bin", d, "application/octet-stream")) for i, d in enumerate(images)]


def post(
    url: str, images: list[bytes], timeout: float = 60.0, key: str = HOSTILE_KEY
) -> tuple[int, float, str]:
    started = time.monotonic()
    try:
        reply = httpx.post(
            f"{url}/v1/embeddings",
            files=files(images),
            timeout=timeout,
            headers={"authorization": f"Bearer {key}"},
        )
    except httpx.HTTPError as exc:
        return 0, time.monotonic() - started, type(exc).__name__
    detail = "" if reply.status_code == 200 else reply.text[:160]
    retry = reply.headers.get("retry-after")
    return (
        reply.status_code,
        time.monotonic() - started,
        detail + (f" [Retry-After {retry}]" if retry else ""),
    )


def stalled(url: str, count: int = 4, hold_s: float = 8.0) -> list[tuple[int, float, str]]:
    """``count`` connections that declare a 64 MiB body and send one byte, held ``hold_s``."""
    host, port = url.removeprefix("http://").split(":")
    socks, answers = [], []
    for _ in range(count):
        s = socket.create_connection((host, int(port)))
        s.sendall(
            b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; "
            b"boundary=b\r\nAuthorization: Bearer " + HOSTILE_KEY.encode() + b"\r\n"
            b"Content-Length: 67108864\r\n\r\n-"
        )
        socks.append((s, time.monotonic()))
    deadline = time.monotonic() + hold_s
    for s, started in socks:
        s.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            head = s.recv(200).split(b"\r\n", 1)[0].decode()
            status = int(head.split()[1]) if head else 0
            answers.append((status, time.monotonic() - started, head))
        except (TimeoutError, OSError):
            answers.append((0, time.monotonic() - started, "no answer (still open)"))
        s.close()
    return answers


def trickle(
    url: str, count: int = 64, seconds: float = 8.0, rate: int = 16_384
) -> list[tuple[int, float, str]]:
    """``count`` multipart uploads of one compact JPEG, each sent at ``rate`` bytes/s."""
    body_image = samples.compact(0)
    boundary = b"trickle"
    body = (
        b"--" + boundary + b'\r\nContent-Disposition: form-data; name="image"; filename="a.jpg"\r\n'
        b"Content-Type: image/jpeg\r\n\r\n" + body_image + b"\r\n--" + boundary + b"--\r\n"
    )
    answers: list[tuple[int, float, str]] = []
    host, port = url.removeprefix("http://").split(":")

    def one() -> None:
        started = time.monotonic()
        s = socket.create_connection((host, int(port)))
        s.sendall(
            b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n"
            + b"Content-Type: multipart/form-data; boundary="
            + boundary
            + b"\r\nAuthorization: Bearer "
            + HOSTILE_KEY.encode()
            + b"\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
        )
        step = max(1, rate // 10)
        try:
            for at in range(0, len(body), step):
                if time.monotonic() - started > seconds * 3:
                    break
                s.sendall(body[at : at + step])
                time.sleep(0.1)
            s.settimeout(30)
            head = s.recv(200).split(b"\r\n", 1)[0].decode()
            answers.append((int(head.split()[1]) if head else 0, time.monotonic() - started, head))
        except OSError as exc:
            answers.append((0, time.monotonic() - started, type(exc).__name__))
        finally:
            s.close()

    threads = [threading.Thread(target=one) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers


def camera_photo() -> bytes:
    return jpeg(photo(*CAMERA_SIZES[12], seed=12))


#: Issue 31's two classes, also sent at a count that is admitted and beside normal clients.
ISSUE_31: dict[str, Callable[[], bytes]] = {
    "jpeg-progressive-strip": hostile.jpeg_progressive_strip,
    "jpeg-arithmetic-progressive": hostile.jpeg_arithmetic_progressive,
}


def classes(url: str) -> dict[str, Callable[[], list[tuple[int, float, str]]]]:
    found: dict[str, Callable[[], list[tuple[int, float, str]]]] = {}
    for name, (make, count) in hostile.BULK.items():
        data = make()

        def bulk(data: bytes = data, count: int = count) -> list[tuple[int, float, str]]:
            return [post(url, [data] * count) for _ in range(3)]

        found[name] = bulk
    # issue 31's classes at a count admission lets in (a batch of 32): decoded, within price
    for name, make in ISSUE_31.items():
        data = make()

        def batch(data: bytes = data) -> list[tuple[int, float, str]]:
            return [post(url, [data] * 32) for _ in range(3)]

        found[f"{name}-x32"] = batch
    found["stalled-64MiB-declared-x4"] = lambda: stalled(url)
    found["trickling-uploads-x64"] = lambda: trickle(url)
    poison, normal = hostile.webp_flat_lossless(), camera_photo()
    found["poison-then-camera-photo"] = lambda: [
        post(url, [poison]),
        post(url, [normal]),
        post(url, [samples.bmp(0)]),
    ]
    found["gzip-body"] = lambda: [_gzip(url)]
    return found


def _gzip(url: str) -> tuple[int, float, str]:
    import gzip

    started = time.monotonic()
    reply = httpx.post(
        f"{url}/v1/embeddings",
        content=gzip.compress(b'{"input": ["a cat"]}'),
        headers={
            "content-type": "application/json",
            "content-encoding": "gzip",
            "authorization": f"Bearer {HOSTILE_KEY}",
        },
    )
    return reply.status_code, time.monotonic() - started, reply.text[:160]


async def normal_clients(url: str, seconds: float, clients: int = 4) -> list[tuple[int, float]]:
    image = samples.compact(3)
    results: list[tuple[int, float]] = []
    end = time.monotonic() + seconds
    headers = {"authorization": f"Bearer {NORMAL_KEY}"}
    async with httpx.AsyncClient(timeout=60, headers=headers) as client:

        async def loop() -> None:
            while time.monotonic() < end:
                started = time.monotonic()
                try:
                    reply = await client.post(f"{url}/v1/embeddings", files=files([image]))
                    status = reply.status_code
                except httpx.HTTPError:
                    status = 0
                results.append((status, time.monotonic() - started))

        await asyncio.gather(*(loop() for _ in range(clients)))
    return results


def summary(results: list[tuple[int, float]]) -> dict[str, Any]:
    ok = [t for s, t in results if s == 200]
    return {
        "requests": len(results),
        "success_rate": round(len(ok) / len(results), 4) if results else 0.0,
        "p95_ms": round(statistics.quantiles(ok, n=20)[-1] * 1000, 1) if len(ok) >= 20 else None,
        "statuses": dict(Counter(s for s, _ in results)),
    }


def mixed(url: str, hostile_loop: Callable[[], object], seconds: float) -> dict[str, Any]:
    stop = threading.Event()

    def attacker() -> None:
        while not stop.is_set():
            hostile_loop()

    thread = threading.Thread(target=attacker, daemon=True)
    thread.start()
    try:
        return summary(asyncio.run(normal_clients(url, seconds)))
    finally:
        stop.set()
        thread.join(timeout=60)


def run(out: Path, gateway_path: str | None, mixed_s: float) -> dict[str, Any]:
    from clip_gateway.export.tokenizer import write_clip_bpe
    from tests.controlled import render_control_repository

    report: dict[str, Any] = {"classes": {}, "mixed": {}}
    with tempfile.TemporaryDirectory(prefix="attacks-") as tmp:
        work = Path(tmp)
        write_clip_bpe(work / "tokenizer.json")
        repository, _control = render_control_repository(work / "repo", work / "tokenizer.json")
        env = {
            "GATEWAY_CANARY_INTERVAL_S": "0",
            "GATEWAY_DECODE_THREADS": "2",
            "GATEWAY_API_KEYS": json.dumps([NORMAL_KEY, HOSTILE_KEY]),
        }
        if gateway_path:
            env["PYTHONPATH"] = gateway_path
        with (
            LocalTriton(repository, log_path=work / "triton.log") as triton,
            GatewayProcess(triton.grpc_url, env=env, log_path=work / "gateway.log") as gateway,
        ):
            gateway.wait_ready()
            assert gateway.process is not None
            pid, url = gateway.process.pid, gateway.url
            for i in range(4):
                post(url, [samples.compact(i)] * 8, key=NORMAL_KEY)
            for name, attack in classes(url).items():
                with sampled(pid) as measured:
                    answers = attack()
                time.sleep(10)
                measured["after_rss_10s"] = rss_mb(pid)
                report["classes"][name] = {
                    "statuses": [a[0] for a in answers],
                    "slowest_answer_s": round(max(a[1] for a in answers), 2),
                    "gateway_cpu_s": round(measured["cpu_s"], 2),
                    "rss_start_mb": round(measured["start_rss"]),
                    "rss_peak_mb": round(measured["peak_rss"]),
                    "rss_after_10s_mb": round(measured["after_rss_10s"]),
                    "details": sorted({a[2] for a in answers if a[2]})[:3],
                }
                print(name, json.dumps(report["classes"][name]), flush=True)
            report["mixed"]["alone"] = summary(asyncio.run(normal_clients(url, mixed_s)))
            print("alone", report["mixed"]["alone"], flush=True)
            loops = classes(url)
            webp = hostile.webp_flat_lossless()
            strips = {name: make() for name, make in ISSUE_31.items()}
            for name, loop in (
                ("webp-flat-lossless-x100", lambda: post(url, [webp] * 100, key=HOSTILE_KEY)),
                *(
                    (f"{name}-x32", lambda data=data: post(url, [data] * 32, key=HOSTILE_KEY))
                    for name, data in strips.items()
                ),
                ("stalled-64MiB-declared-x4", loops["stalled-64MiB-declared-x4"]),
                ("trickling-uploads-x64", loops["trickling-uploads-x64"]),
            ):
                report["mixed"][name] = mixed(url, loop, mixed_s)
                print(name, report["mixed"][name], flush=True)
    write_results(out, "attacks", report)
    return report


def render(before: dict[str, Any], after: dict[str, Any], out: Path) -> None:
    """attacks.md (both runs, per class and the mixed run) and attacks.png (normal clients'
    p95 and success rate, alone and beside each hostile client)."""
    lines = [
        "| class | run | statuses | slowest answer s | gateway CPU-s "
        "| RSS start / peak / +10 s MB |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name in after["classes"]:
        for label, run_ in (("before", before), ("after", after)):
            c = run_["classes"].get(name)
            if c is None:
                continue
            statuses = ", ".join(f"{k}x{v}" for k, v in sorted(Counter(c["statuses"]).items()))
            lines.append(
                f"| {name} | {label} | {statuses} | {c['slowest_answer_s']} | "
                f"{c['gateway_cpu_s']} | {c['rss_start_mb']} / {c['rss_peak_mb']} / "
                f"{c['rss_after_10s_mb']} |"
            )
    lines += [
        "",
        "| normal clients | run | success rate | p95 ms | statuses |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name in after["mixed"]:
        for label, run_ in (("before", before), ("after", after)):
            m = run_["mixed"].get(name)
            if m is not None:
                lines.append(
                    f"| {name} | {label} | {m['success_rate']} | {m['p95_ms']} | {m['statuses']} |"
                )
    (out / "attacks.md").write_text("\n".join(lines) + "\n")
    names = list(after["mixed"])
    with figure(out / "attacks.png", ncols=2, figsize=(11, 4)) as (_, axes):
        for offset, (label, run_) in enumerate((("before", before), ("after", after))):
            xs = [i + offset * 0.4 for i in range(len(names))]
            rates = [run_["mixed"].get(n, {}).get("success_rate") or 0 for n in names]
            p95 = [run_["mixed"].get(n, {}).get("p95_ms") or 0 for n in names]
            axes[0].bar(xs, rates, width=0.4, label=label)
            axes[1].bar(xs, p95, width=0.4, label=label)
        for axis, title in zip(axes, ("normal: success rate", "normal: p95 ms"), strict=True):
            axis.set_xticks([i + 0.2 for i in range(len(names))], names, rotation=20, fontsize=7)
            axis.set_title(title)
            axis.legend()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench attacks", description=__doc__)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parents[1] / "results" / "attacks"
    )
    parser.add_argument("--gateway-path", default=None)
    parser.add_argument("--mixed-seconds", type=float, default=15.0)
    parser.add_argument("--render", nargs=2, type=Path, default=None)
    args = parser.parse_args(argv)
    if args.render:
        before, after = (json.loads(path.read_text()) for path in args.render)
        args.out.mkdir(parents=True, exist_ok=True)
        render(before, after, args.out)
        return 0
    run(args.out, args.gateway_path, args.mixed_seconds)
    return 0
