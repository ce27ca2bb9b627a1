"""The one launch path, run as users and orchestrators run it: ``clip-gateway serve`` (what
``make serve`` runs) and the container entrypoint, as real process trees (supervisor, Triton
and its Python-backend stubs, the gateway), stopped by each signal they may get.

A stop must drain in-flight requests, leave no process, shared-memory segment or scratch
directory behind and exit 0; a killed supervisor's children must stop by themselves.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import pytest

from bench.harness.supervisor import Supervisor, slow_templates
from clip_gateway.backend import shm
from clip_gateway.config.processes import ReservedPort, reserve_port
from clip_gateway.imaging import paths
from tests import reference, samples
from tests.controlled import wait_until
from tests.metrics import sample

ROOT = Path(__file__).resolve().parents[2]


def parent_of(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def descendants(pid: int) -> set[int]:
    parents = {
        int(p.name): parent_of(int(p.name)) for p in Path("/proc").iterdir() if p.name.isdigit()
    }
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def shm_of(pids: set[int]) -> list[str]:
    return [p.name for p in Path("/dev/shm").glob(f"{shm.PREFIX}*") if shm.owner(p.name) in pids]


@dataclass
class Launched:
    process: subprocess.Popen[bytes]
    url: str
    log: Path
    scratch: Path
    ports: list[ReservedPort] = field(default_factory=list)

    def tree(self) -> set[int]:
        return descendants(self.process.pid)

    def find(self, name: str) -> int:
        (pid,) = [p for p in self.tree() if name in cmdline(p) and "backend_stub" not in cmdline(p)]
        return pid


def launch(
    command: list[str], env: dict[str, str], tmp_path: Path, port: int
) -> subprocess.Popen[bytes]:
    log = tmp_path / "launch.log"
    with open(log, "wb") as output:
        return subprocess.Popen(
            command, env={**os.environ, **env}, cwd=ROOT, stdout=output, stderr=subprocess.STDOUT
        )


@pytest.fixture(params=["serve", "entrypoint"])
def launched(request, exported, tmp_path: Path) -> Iterator[Launched]:
    """``clip-gateway serve`` (the make serve path) or the container entrypoint, READY."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = {"GATEWAY_SCRATCH_DIR": str(scratch), "GATEWAY_DRAIN_S": "60"}
    with Supervisor(tmp_path / "launch.log") as supervisor:
        if request.param == "serve":
            # the cache the session's export lives in: `serve` finds the model there
            cache = exported.directory.parents[1]
            # the profile pinned: auto would time every CPU profile (test_bf16_served.py)
            supervisor.serve("--weights", "random", "--cache-dir", str(cache), "--profile", "cpu",
                             "--log-file", str(tmp_path / "children.log"), env=env)  # fmt: skip
        else:
            # the profile named, not detected: the test must not depend on whether this host
            # has a GPU
            supervisor.entrypoint(GATEWAY_MODEL_DIR=str(exported.directory),
                                  GATEWAY_TRITON_PROFILE="cpu", **env)  # fmt: skip
        supervisor.wait_ready(timeout=180)
        yield Launched(supervisor.process, supervisor.url, supervisor.log, scratch,
                       supervisor.ports)  # fmt: skip


def embed(url: str, count: int = 1) -> httpx.Response:
    files = [("image", (f"{i}.jpg", samples.compact(i), "image/jpeg")) for i in range(count)]
    return httpx.post(f"{url}/v1/embeddings", files=files, timeout=120)


def assert_nothing_left(launched: Launched, tree: set[int]) -> None:
    wait_until(lambda: not [p for p in tree if alive(p)], "every process of the tree exited")
    assert not shm_of(tree), "shared-memory segments left behind"
    assert not list(launched.scratch.iterdir()), "scratch directory left behind"


def test_the_ready_line_and_models_name_the_image_path_that_runs(launched: Launched) -> None:
    expected = paths.current()  # this venv's PIL: the one the launched processes import
    line = next(line for line in launched.log.read_text().splitlines() if "ready on http" in line)
    assert f"resize: {expected.resize}" in line
    assert ("NOT the SIMD fast path" in line) == (not expected.simd)
    (card,) = httpx.get(f"{launched.url}/v1/models", timeout=10).json()["data"]
    assert card["imaging"] == dataclasses.asdict(expected)


def test_sigterm_drains_an_in_flight_request_then_stops_everything(launched: Launched) -> None:
    tree = launched.tree()
    names = " | ".join(cmdline(p) for p in tree)
    assert "tritonserver" in names and "clip_gateway.http" in names and "backend_stub" in names
    assert embed(launched.url).status_code == 200
    triton = launched.find("tritonserver")
    answer: dict[str, httpx.Response] = {}
    # Triton paused: the request is admitted, decoded and then waits on its gRPC call, in
    # flight for as long as the test needs (observable in the gateway's own gauge)
    os.kill(triton, signal.SIGSTOP)
    try:
        thread = threading.Thread(target=lambda: answer.update(r=embed(launched.url, 4)))
        thread.start()
        wait_until(
            lambda: (
                sample(httpx.get(f"{launched.url}/metrics").text, "gateway_inflight_items") == 4
            ),
            "the request is in flight",
        )
        launched.process.send_signal(signal.SIGTERM)
        wait_until(lambda: "SIGTERM: stopping" in launched.log.read_text(), "SIGTERM handled")
    finally:
        os.kill(triton, signal.SIGCONT)
    thread.join(120)
    assert launched.process.wait(120) == 0, launched.log.read_text()[-3000:]
    assert answer["r"].status_code == 200  # drained, not dropped
    assert len(answer["r"].json()["data"]) == 4
    assert_nothing_left(launched, tree)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP])
def test_every_stop_signal_stops_everything_cleanly(launched: Launched, signum: int) -> None:
    tree = launched.tree()
    assert embed(launched.url).status_code == 200  # shared-memory regions now exist
    assert shm_of(tree)
    launched.process.send_signal(signum)
    assert launched.process.wait(120) == 0, launched.log.read_text()[-3000:]
    assert_nothing_left(launched, tree)


def test_a_killed_supervisor_leaves_nothing_running(launched: Launched) -> None:
    tree = launched.tree()
    assert embed(launched.url).status_code == 200
    launched.process.kill()  # SIGKILL: no handler runs in the supervisor
    launched.process.wait()
    # the children get SIGTERM from the kernel (parent-death signal) and stop by themselves
    wait_until(lambda: not [p for p in tree if alive(p)], "children exited on their own")
    assert not shm_of(tree)


def test_a_dead_triton_stops_the_service_with_an_error(launched: Launched) -> None:
    os.kill(launched.find("tritonserver"), signal.SIGKILL)
    assert launched.process.wait(120) == 1
    assert "tritonserver exited" in launched.log.read_text()


@dataclass
class Starting:
    """The container entrypoint held in Triton's model load (tests/models/slow_start.py)."""

    process: subprocess.Popen[bytes]
    log: Path
    scratch: Path
    hold: Path
    url: str

    def tree(self) -> set[int]:
        return descendants(self.process.pid)


@pytest.fixture
def starting(exported, tmp_path: Path) -> Iterator[Starting]:
    scratch, hold = tmp_path / "scratch", tmp_path / "hold"
    scratch.mkdir()
    hold.mkdir()
    with Supervisor(tmp_path / "launch.log") as supervisor:
        supervisor.entrypoint(
            GATEWAY_SCRATCH_DIR=str(scratch),
            GATEWAY_MODEL_DIR=str(exported.directory),
            GATEWAY_TRITON_PROFILE="cpu",
            GATEWAY_TRITON_TEMPLATES_DIR=str(slow_templates(tmp_path, hold)),
            GATEWAY_STOP_DELAY_S="600",  # serving only: a stop during start-up has no delay
        )
        try:
            yield Starting(supervisor.process, supervisor.log, scratch, hold, supervisor.url)
        finally:
            (hold / "release").touch()


def test_sigterm_while_triton_loads_the_model_stops_everything_at_once(
    starting: Starting,
) -> None:
    """A stop before Triton is READY (a long model load, a TensorRT engine build) is not
    waited out: no start-up budget, no Triton grace for a load nobody will use."""
    wait_until(lambda: (starting.hold / "initializing").exists(), "the model is loading", 180)
    tree = starting.tree()
    assert any("tritonserver" in cmdline(p) for p in tree)
    started = time.monotonic()
    starting.process.send_signal(signal.SIGTERM)
    assert starting.process.wait(120) == 0, starting.log.read_text()[-3000:]
    print(f"\nSIGTERM during the model load: exited in {time.monotonic() - started:.2f} s")
    assert "SIGTERM: stopping (during start-up)" in starting.log.read_text()
    wait_until(lambda: not [p for p in tree if alive(p)], "every process of the tree exited")
    assert not list(starting.scratch.iterdir()), "scratch directory left behind"


def test_stop_delay_keeps_serving_and_a_second_signal_ends_it(starting: Starting) -> None:
    """After the first SIGTERM the gateway still answers (endpoints are letting go); a second
    signal skips the rest of the delay and drains."""
    (starting.hold / "release").touch()

    def started() -> bool:
        assert starting.process.poll() is None, starting.log.read_text()[-3000:]
        return "ready on http" in starting.log.read_text()  # the supervisor's start-up is over

    wait_until(started, "the supervisor has started everything", timeout=180, every=0.2)
    tree = starting.tree()
    starting.process.send_signal(signal.SIGTERM)
    wait_until(lambda: "still serving for 600 s" in starting.log.read_text(), "delay started")
    assert embed(starting.url).status_code == 200  # new requests are still served
    assert starting.process.poll() is None
    starting.process.send_signal(signal.SIGTERM)
    assert starting.process.wait(120) == 0, starting.log.read_text()[-3000:]
    wait_until(lambda: not [p for p in tree if alive(p)], "every process of the tree exited")
    assert not shm_of(tree)


def test_a_profile_whose_backend_triton_lacks_is_refused_with_the_reason(
    exported, tmp_path: Path
) -> None:
    """The PyPI tritonserver has no onnxruntime backend: the cpu profile on it is a
    configuration error (exit 2) named before Triton starts, not a crash loop."""
    port = reserve_port()
    try:
        env = {
            "GATEWAY_MODEL_DIR": str(exported.directory),
            "GATEWAY_TRITON_PROFILE": "cpu",
            "GATEWAY_TRITON_CPU_BACKEND": "onnxruntime",
            "GATEWAY_SCRATCH_DIR": str(tmp_path),
            "GATEWAY_HOST": "127.0.0.1",
            "GATEWAY_PORT": str(port.port),
        }
        process = launch([sys.executable, "-m", "clip_gateway.launcher.supervisor"], env, tmp_path,
                         port.port)  # fmt: skip
        assert process.wait(120) == 2
        log = (tmp_path / "launch.log").read_text()
        assert "needs Triton's onnxruntime backend" in log
        assert not [p for p in tmp_path.iterdir() if p.name.startswith("clip-gateway-")]
    finally:
        port.release()


@pytest.mark.parametrize("keys_file", [None, "empty"])
def test_the_container_refuses_to_serve_the_network_without_a_key(
    exported, tmp_path: Path, keys_file: str | None
) -> None:
    """The image listens on 0.0.0.0: with no API key (none set, or a keys file holding none)
    the entrypoint stops before any work, exit 2, and says how to fix it; nothing is bound."""
    env = {
        "GATEWAY_MODEL_DIR": str(exported.directory),
        "GATEWAY_TRITON_PROFILE": "cpu",
        "GATEWAY_SCRATCH_DIR": str(tmp_path),
        "GATEWAY_HOST": "0.0.0.0",
        "GATEWAY_API_KEYS": "[]",
    }
    if keys_file is not None:
        (tmp_path / "keys").write_text("# no keys yet\n\n")
        env["GATEWAY_API_KEYS_FILE"] = str(tmp_path / "keys")
    process = launch([sys.executable, "-m", "clip_gateway.launcher.supervisor"], env, tmp_path, 0)
    assert process.wait(60) == 2
    log = (tmp_path / "launch.log").read_text()
    assert "no API key configured" in log and "GATEWAY_ANONYMOUS=true" in log
    if keys_file is not None:
        assert f"{tmp_path / 'keys'} holds none" in log
    assert "tritonserver" not in log
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("clip-gateway-")]


#: SigLIP images as its own pipeline squashes them (not cropped): wide, tall, EXIF-rotated,
#: PNG and a camera photo. Measured (random weights): mean 0.999998, min 0.999991; the same
#: photos cropped as ViT-B/32 is (the wrong resize mode): mean 0.896.
SIGLIP_MEAN_LIMIT = 0.995


def siglip_photos() -> list[bytes]:
    from bench.harness.photos import CAMERA_SIZES, jpeg, photo

    return [
        samples.encode(samples.small_photo(11, (900, 300)), "PNG"),
        samples.encode(samples.small_photo(12, (300, 800)), "JPEG", quality=92),
        samples.oriented_jpeg(6, seed=13),
        jpeg(photo(*CAMERA_SIZES[8], seed=14)),
        samples.compact(15),
    ]


def test_serve_runs_another_open_clip_model(exported, tmp_path: Path) -> None:
    """``make serve CLIP_MODEL=ViT-B-16-SigLIP CLIP_WEIGHTS=random``: exported by the launch path
    (or found in the cache), served with its own dimension, preprocessing (squash, mean/std 0.5)
    and id; faithful to open_clip's own pipeline for it; texts refused, saying why; with
    ``--immich``, Immich's routes on, and no Immich name claimed by random weights."""
    supervisor = Supervisor(tmp_path / "launch.log")
    supervisor.serve("--model", "ViT-B-16-SigLIP", "--weights", "random", "--immich",
                     "--cache-dir", str(exported.directory.parents[1]),
                     "--log-file", str(tmp_path / "children.log"),
                     # the profile pinned: auto would time every CPU profile (test_bf16_served)
                     env={"GATEWAY_SCRATCH_DIR": str(tmp_path),
                          "GATEWAY_TRITON_PROFILE": "cpu"})  # fmt: skip
    url = supervisor.url

    try:
        # a first run exports the model first (about a minute on the 2-core CI machine)
        supervisor.wait_ready(timeout=600, every=0.5)
        (model,) = httpx.get(f"{url}/v1/models", timeout=10).json()["data"]
        assert model["id"] == "ViT-B-16-SigLIP"
        assert model["modalities"] == ["image"] and "Hugging Face" in model["text_unavailable"]
        assert model["preprocessing"]["resize_mode"] == "squash"
        assert model["preprocessing"]["mean"] == [0.5, 0.5, 0.5]
        # --immich reaches the HTTP process; random weights claim no Immich name (docs/IMMICH.md)
        assert model["immich_names"] == []
        entries = '{"clip": {"visual": {"modelName": "ViT-B-16-SigLIP__webli"}}}'
        refused = httpx.post(f"{url}/predict", timeout=30, files=[
            ("entries", (None, entries)), ("image", ("blob", samples.compact(1)))])  # fmt: skip
        assert refused.status_code == 409, refused.text[:300]
        photos = siglip_photos()
        form = [("image", (f"{i}", p, "image/jpeg")) for i, p in enumerate(photos)]
        answer = httpx.post(f"{url}/v1/embeddings", files=form, timeout=120)
        assert answer.status_code == 200, answer.text[:300]
        got = np.array([row["embedding"] for row in answer.json()["data"]])
        assert got.shape == (len(photos), 768)
        cosines = reference.cosines(got, reference.embed_images(photos, name="ViT-B-16-SigLIP"))
        cropped = reference.cosines(
            got, reference.embed_images(photos, "shortest-crop", name="ViT-B-16-SigLIP")
        )
        print(f"\nSigLIP fidelity: mean {cosines.mean():.6f} min {cosines.min():.6f}; "
              f"had it cropped: mean {cropped.mean():.6f}")  # fmt: skip
        assert cosines.mean() >= SIGLIP_MEAN_LIMIT
        assert cropped.mean() < SIGLIP_MEAN_LIMIT  # the limit would catch the wrong resize mode
        text = httpx.post(f"{url}/v1/embeddings", json={"input": ["a cat"]}, timeout=30)
        assert text.status_code == 400 and text.json()["type"].endswith("/modality-unavailable")
        assert supervisor.stop(120) == 0
    finally:
        supervisor.close()
