"""``python -m bench stops``: how long the container entrypoint takes to stop on SIGTERM, in
every phase of its life, as an orchestrator would see it (SIGTERM sent → process exited).

The phases: exporting the model (a child process running torch); Triton loading the model
(``tests/models/slow_start.py`` holds it in ``initialize``, as a long load or a TensorRT engine
build would); serving, idle; serving with a batch-32 request in flight (it must come back 200);
serving with a stop delay. The tree's leftovers are the integration tests' business
(tests/integration/test_supervisor.py); this measures time.
"""

from __future__ import annotations

import os
import signal
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench.harness.output import write_results
from bench.harness.photos import compact_jpeg
from bench.harness.supervisor import Supervisor, slow_templates

STOP_DELAY_S = 5.0


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.02)


def entrypoint(work: Path, env: dict[str, str]) -> Supervisor:
    """The container entrypoint on loopback (cpu profile, text logs), its output in a log file."""
    scratch = work / "scratch"
    scratch.mkdir(exist_ok=True)
    supervisor = Supervisor(work / "entrypoint.log")
    try:
        return supervisor.entrypoint(GATEWAY_SCRATCH_DIR=str(scratch), GATEWAY_TRITON_PROFILE="cpu",
                                     GATEWAY_LOG_FORMAT="text", **env)  # fmt: skip
    except BaseException:
        supervisor.close()
        raise


def timed_stop(entry: Supervisor, *, second_signal: bool = False) -> float:
    """SIGTERM (twice: skip the stop delay) → exit; seconds, and the exit code checked."""
    started = time.monotonic()
    entry.process.send_signal(signal.SIGTERM)
    if second_signal:
        wait_for(lambda: entry.says("still serving"), "the stop delay began")
        entry.process.send_signal(signal.SIGTERM)
    code = entry.process.wait(300)
    elapsed = time.monotonic() - started
    if code != 0:
        raise RuntimeError(f"exit code {code}:\n{entry.tail()}")
    return elapsed


def phase_export(work: Path, model_dir: Path) -> float:
    """A cache miss: the export child (torch) is running when SIGTERM comes."""
    entry = entrypoint(work, {"GATEWAY_WEIGHTS": "random:7", "GATEWAY_CACHE_DIR": str(work)})
    try:
        wait_for(lambda: entry.says("exporting"), "the export started")
        wait_for(lambda: any(p for p in Path("/proc").glob("*/cmdline")
                             if b"-mexport" in _read(p)), "the exporter runs")  # fmt: skip
        return timed_stop(entry)
    finally:
        entry.close()


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes().replace(b"\0", b"")
    except OSError:
        return b""


def phase_model_load(work: Path, model_dir: Path) -> float:
    hold = work / "hold"
    hold.mkdir()
    templates = slow_templates(work, hold)
    entry = entrypoint(work, {"GATEWAY_MODEL_DIR": str(model_dir),
                              "GATEWAY_TRITON_TEMPLATES_DIR": str(templates)})  # fmt: skip
    try:
        wait_for(lambda: (hold / "initializing").exists(), "Triton is loading the model")
        return timed_stop(entry)
    finally:
        (hold / "release").touch()
        entry.close()


def serving(work: Path, model_dir: Path, **env: str) -> Supervisor:
    entry = entrypoint(work, {"GATEWAY_MODEL_DIR": str(model_dir), **env})
    wait_for(lambda: entry.says("ready on http"), "the entrypoint is serving")
    return entry


def embed(url: str, count: int) -> httpx.Response:
    files = [("image", (f"{i}.jpg", compact_jpeg(i), "image/jpeg")) for i in range(count)]
    return httpx.post(f"{url}/v1/embeddings", files=files, timeout=120)


def phase_idle(work: Path, model_dir: Path) -> float:
    entry = serving(work, model_dir)
    try:
        assert embed(entry.url, 1).status_code == 200
        return timed_stop(entry)
    finally:
        entry.close()


def phase_in_flight(work: Path, model_dir: Path) -> float:
    entry = serving(work, model_dir)
    try:
        answer: dict[str, httpx.Response] = {}
        thread = threading.Thread(target=lambda: answer.update(r=embed(entry.url, 32)))
        thread.start()

        def in_flight() -> bool:
            text = httpx.get(f"{entry.url}/metrics", timeout=5).text
            return "gateway_inflight_items 32.0" in text

        wait_for(in_flight, "the request is in flight")
        elapsed = timed_stop(entry)
        thread.join(120)
        if answer["r"].status_code != 200:
            raise RuntimeError(f"the in-flight request got {answer['r'].status_code}")
        return elapsed
    finally:
        entry.close()


def phase_stop_delay(work: Path, model_dir: Path) -> float:
    entry = serving(work, model_dir, GATEWAY_STOP_DELAY_S=str(STOP_DELAY_S))
    try:
        return timed_stop(entry)
    finally:
        entry.close()


def phase_stop_delay_second_signal(work: Path, model_dir: Path) -> float:
    entry = serving(work, model_dir, GATEWAY_STOP_DELAY_S="600")
    try:
        return timed_stop(entry, second_signal=True)
    finally:
        entry.close()


PHASES: dict[str, Callable[[Path, Path], float]] = {
    "exporting the model (child process)": phase_export,
    "Triton loading the model (not READY)": phase_model_load,
    "serving, idle": phase_idle,
    "serving, a batch-32 request in flight (answered 200)": phase_in_flight,
    f"serving, GATEWAY_STOP_DELAY_S={STOP_DELAY_S:g}": phase_stop_delay,
    "serving, stop delay 600 s, a second SIGTERM": phase_stop_delay_second_signal,
}


def run(rounds: int, out: Path) -> dict[str, Any]:
    from clip_gateway.export.build import ensure_exported
    from clip_gateway.model.spec import Weights

    model_dir = ensure_exported("ViT-B-32", Weights.random(0)).directory
    results: dict[str, Any] = {"rounds": rounds, "machine": f"{os.cpu_count()} CPUs", "phases": {}}
    for name, phase in PHASES.items():
        seconds = []
        for _ in range(rounds):
            with tempfile.TemporaryDirectory(prefix="clip-gateway-stops-") as work:
                seconds.append(phase(Path(work), model_dir))
            print(f"{name}: {seconds[-1]:.2f} s", flush=True)
        results["phases"][name] = {
            "seconds": [round(s, 3) for s in seconds],
            "median_s": round(statistics.median(seconds), 3),
            "max_s": round(max(seconds), 3),
        }
    lines = [
        "# SIGTERM → exit of the container entrypoint, per phase",
        "",
        f"`python -m bench stops` ({rounds} rounds per phase, {results['machine']}, cpu profile, "
        "random-weights ViT-B/32)",
        "",
        "| phase | median s | max s |",
        "| --- | --- | --- |",
        *(
            f"| {n} | {r['median_s']:.2f} | {r['max_s']:.2f} |"
            for n, r in results["phases"].items()
        ),
    ]
    write_results(out, "stops", results, markdown="\n".join(lines) + "\n")
    return results
