"""The image as users run it (podman, deploy/image/): hardened, ready within its budget, faithful
to open_clip, healthy, stopped cleanly within the derived grace, restarted on the same volume;
and what it carries: graphs its ONNX Runtime reads, no compiler, torch or test file.

Runs only under `make image-test` (CLIP_GATEWAY_IMAGE_TEST=1), after `make image`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest

from clip_gateway.config import timings
from clip_gateway.config.settings import Settings
from tests import reference, samples
from tests.image.containers import (
    IMAGE,
    KEY,
    PREFIX,
    ROOT,
    STARTUP_S,
    Container,
    Secrets,
    podman,
    remove_leftovers,
    run_container,
)
from tests.integration.test_fidelity import MEAN_LIMIT, MIN_LIMIT

AUTH = {"Authorization": f"Bearer {KEY}"}
FIGURES = ROOT / "build" / "image" / "image-test" / "figures.json"
BUILD_STAGE = os.environ.get("CLIP_GATEWAY_BUILD_IMAGE", "clip-gateway-build:local")


@pytest.fixture(scope="module")
def secrets() -> Iterator[Secrets]:
    """The API key file, mounted read-only as a secret; 0644 inside a 0755 directory, like
    `make api-key` (the image's user, 10001, reads it)."""
    remove_leftovers()
    directory = ROOT / "build" / "image" / "image-test"
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    directory.chmod(0o755)
    secrets = Secrets(directory)
    secrets.keys_file.write_text(KEY + "\n")
    secrets.keys_file.chmod(0o644)
    yield secrets
    remove_leftovers()


@pytest.fixture(scope="module")
def first(secrets: Secrets) -> Iterator[Container]:
    """The first start, on an empty engine-cache volume."""
    container = run_container(f"{PREFIX}-first", secrets)
    container.wait_ready()
    yield container
    podman("rm", "-f", "-v", "-t", "0", container.name, check=False)


def record(**figures: object) -> None:
    known = json.loads(FIGURES.read_text()) if FIGURES.exists() else {}
    FIGURES.write_text(json.dumps({**known, **figures}, indent=2) + "\n")


def test_it_runs_hardened(first: Container) -> None:
    """uid 10001, no capability at all, a read-only root, /dev/shm of 1 GiB; and its entrypoint
    runs through NGC's entrypoint script (the stand-in's banner) under tini."""
    record(first_ready_s=round(first.ready_s or 0, 1))
    assert first.exec("id", "-u").stdout.strip() == "10001"
    status = first.exec("cat", "/proc/1/status").stdout
    assert re.search(r"^CapEff:\s+0+$", status, re.M), status
    assert re.search(r"^CapBnd:\s+0+$", status, re.M), status
    assert first.exec("cat", "/proc/1/comm").stdout.strip() == "tini"
    refused = first.exec("touch", "/opt/venv/written", check=False)
    assert refused.returncode != 0 and "Read-only file system" in refused.stderr
    host = first.inspect()["HostConfig"]
    assert host["ReadonlyRootfs"] is True and host["ShmSize"] == 1 << 30
    assert "== NVIDIA entrypoint" in first.logs()
    # the engine cache is the one place it writes that outlives it
    first.exec("touch", "/var/cache/clip-gateway/written-by-the-first-start")


def test_the_api_key_comes_from_the_mounted_file(first: Container) -> None:
    assert httpx.get(f"{first.url}/v1/models", timeout=10).status_code == 401
    assert httpx.get(f"{first.url}/v1/models", headers=AUTH, timeout=10).status_code == 200


def test_images_and_texts_are_open_clips_embeddings(first: Container) -> None:
    """The fidelity references the integration tests use (open_clip's pipeline, same random
    weights, seed 0) and their limits."""
    images = [
        ("jpeg", samples.oriented_jpeg(6, seed=3)),
        ("png", samples.png(7)),
        ("webp", samples.webp(8)),
        ("photo", samples.progressive_jpeg(9, (1600, 1200))),
    ]
    texts = ["a photo of a cat", "a red car parked by the sea", "ViT-B/32"]
    with httpx.Client(base_url=first.url, headers=AUTH, timeout=120) as http:
        got_images = []
        for name, data in images:
            response = http.post("/v1/embeddings", files=[("image", (name, data, "image/jpeg"))])
            assert response.status_code == 200, response.text[:300]
            got_images.append(response.json()["data"][0]["embedding"])
        response = http.post("/v1/embeddings", json={"input": texts, "modality": "text"})
        assert response.status_code == 200, response.text[:300]
        got_texts = [row["embedding"] for row in response.json()["data"]]
    expected = reference.embed_images([data for _, data in images])
    image_cos = reference.cosines(np.array(got_images), expected)
    text_cos = reference.cosines(
        np.array(got_texts), reference.embed_tokens(reference.tokens(texts))
    )
    record(image_cosines=[round(float(c), 6) for c in image_cos],
           text_cosines=[round(float(c), 6) for c in text_cos])  # fmt: skip
    for cosines in (image_cos, text_cos):
        assert cosines.mean() >= MEAN_LIMIT and cosines.min() >= MIN_LIMIT, cosines


def test_the_healthcheck_reaches_healthy(first: Container) -> None:
    """The image's HEALTHCHECK, run by podman (no systemd timer here: run on demand)."""
    run = podman("healthcheck", "run", first.name, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    state = first.inspect()["State"]
    health = state.get("Health") or state.get("Healthcheck")
    assert health["Status"] == "healthy", health


def exported_graphs() -> Iterator[Path]:
    """The image's /models/export, copied out (no container runs for it)."""
    name = f"{PREFIX}-copy"
    podman("rm", "-f", "-v", name, check=False)
    podman("create", "--name", name, IMAGE)
    try:
        with tempfile.TemporaryDirectory() as scratch:
            podman("cp", f"{name}:/models/export", scratch)
            yield from sorted(Path(scratch, "export").rglob("*.onnx"))
    finally:
        podman("rm", "-f", "-v", name, check=False)


PROBE = """
import glob, json, onnxruntime as ort
from onnxruntime.capi import onnxruntime_pybind11_state as c
schemas = c.get_all_operator_schema()
opset = max(s.since_version for s in schemas if s.domain == "")
try:
    ort.InferenceSession("/probe/ir99.onnx", providers=["CPUExecutionProvider"])
    max_ir = None
except Exception as exc:
    max_ir = int(str(exc).rsplit("max supported IR version:", 1)[1].split()[0].strip(" ."))
loaded, failed = [], {}
for path in sorted(glob.glob("/models/export/**/*.onnx", recursive=True)):
    try:
        ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        loaded.append(path)
    except Exception as exc:
        failed[path] = str(exc)[:300]
print(json.dumps({"version": ort.__version__, "max_opset": opset, "max_ir": max_ir,
                  "loaded": loaded, "failed": failed}))
"""


def test_the_exported_graphs_are_what_the_images_onnx_runtime_reads() -> None:
    """IR version and opsets of every exported graph against what the image's ONNX Runtime
    implements (asked of it: its operator schemas; its refusal of a graph stamped IR 99), and
    every graph loaded by it (the stand-in: ORT 1.20.1, NGC 25.01's onnxruntime backend's)."""
    with tempfile.TemporaryDirectory() as probe_dir:
        probe = Path(probe_dir)
        probe.chmod(0o755)
        graph = onnx.helper.make_graph(
            [onnx.helper.make_node("Identity", ["x"], ["y"])], "ir99",
            [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
            [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
        )  # fmt: skip
        model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)])
        model.ir_version = 99
        onnx.save(model, probe / "ir99.onnx")
        (probe / "ir99.onnx").chmod(0o644)
        (probe / "probe.py").write_text(PROBE)
        (probe / "probe.py").chmod(0o644)
        run = podman("run", "--rm", "--user", "10001:10001", "--network", "none",
                     "-v", f"{probe}:/probe:ro", "--entrypoint", "/usr/bin/python3", IMAGE,
                     "/probe/probe.py")  # fmt: skip
    ort = json.loads(run.stdout.strip().splitlines()[-1])
    graphs = {path.name: onnx.load(str(path), load_external_data=False)
              for path in exported_graphs()}  # fmt: skip
    stamped = {
        name: (graph.ir_version, {o.domain or "ai.onnx": o.version for o in graph.opset_import})
        for name, graph in graphs.items()
    }
    record(onnxruntime=ort | {"loaded": len(ort["loaded"])}, graphs=stamped)
    assert graphs and ort["max_ir"] is not None, ort
    for name, (ir_version, opsets) in stamped.items():
        assert ir_version <= ort["max_ir"], (name, ir_version, ort)
        assert opsets.get("ai.onnx", 0) <= ort["max_opset"], (name, opsets, ort)
    assert not ort["failed"] and len(ort["loaded"]) == len(graphs), ort


def test_nothing_of_the_build_reaches_the_runtime_image() -> None:
    """No compiler, no torch, no test file in the runtime image; the same check finds the
    compiler in the build stage (so it can find one)."""
    check = (
        "for tool in cc gcc g++ c++ make x86_64-linux-gnu-gcc; do "
        "command -v $tool && echo compiler:$tool; done; "
        "find / -xdev \\( -path /proc -o -path /sys \\) -prune -o \\( -name torch -o -name "
        "'torch-*.dist-info' -o -name 'test_*.py' -o -name conftest.py -o -name tests -o -name "
        "'*.whl' \\) -print 2>/dev/null | grep -v '^/usr/share/' | sed 's/^/found:/'; true"
    )

    def findings(image: str) -> list[str]:
        run = podman("run", "--rm", "--network", "none", "--entrypoint", "/bin/sh", image,
                     "-c", check)  # fmt: skip
        lines = run.stdout.splitlines()
        return [line for line in lines if line.startswith(("compiler:", "found:"))]

    found = findings(IMAGE)
    # site-packages' own test suites of third-party wheels are theirs, not ours; ours never ship
    ours = [line for line in found if "compiler:" in line or "/torch" in line or "gateway" in line
            or line.endswith(".whl") or "/models/" in line]  # fmt: skip
    assert ours == [], ours
    # the build stage (tagged by `make image`) has the compiler pillow-simd was built with
    assert podman("image", "exists", BUILD_STAGE, check=False).returncode == 0, BUILD_STAGE
    assert any(line.startswith("compiler:") for line in findings(BUILD_STAGE))


#: Each process in the container but this one (`podman exec` starts it outside tini's tree):
#: pid, parent pid, name, read from /proc (no procps needed).
PROCESSES = (
    "import os\n"
    "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
    "    if int(pid) == os.getpid():\n"
    "        continue\n"
    "    try:\n"
    "        stat = open(f'/proc/{pid}/stat').read()\n"
    "    except OSError:\n"
    "        continue\n"
    "    name = stat[stat.index('(') + 1 : stat.rindex(')')]\n"
    "    print(pid, stat[stat.rindex(')') + 2 :].split()[1], name)\n"
)


def test_stop_exits_zero_within_the_derived_grace(first: Container, secrets: Secrets) -> None:
    """`podman stop` (SIGTERM) with the grace the settings derive (timings.kill_after_s): exit 0
    means the supervisor stopped the gateway and Triton and exited before any SIGKILL; every
    process it ran was in its tree."""
    derived = timings.derive(Settings.from_env(launch={"startup_timeout_s": STARTUP_S}))
    tree = first.exec("python3", "-c", PROCESSES).stdout
    rows = [line.split(None, 2) for line in tree.splitlines()]
    parents = {int(pid): int(ppid) for pid, ppid, _ in rows}
    names = {name for _, _, name in rows}
    assert {"tini", "tritonserver"} <= names, rows
    for pid in parents:  # every process descends from tini (PID 1): nothing it cannot stop
        seen = pid
        while seen not in (1, 0):
            seen = parents.get(seen, 0)
        assert seen == 1 or pid == 1, rows
    podman("stop", "-t", str(derived.kill_after_s), first.name, timeout=derived.kill_after_s + 60)
    state = first.inspect()["State"]
    logs = first.logs()
    record(stop_exit_code=state["ExitCode"], kill_after_s=derived.kill_after_s)
    assert state["ExitCode"] == 0, logs[-4000:]
    assert "SIGTERM: stopping" in logs and "Traceback" not in logs, logs[-4000:]


def test_a_second_start_reuses_the_cache_volume(first: Container, secrets: Secrets) -> None:
    """The volume the first container wrote is the second one's; both start times recorded."""
    podman("stop", "-t", "90", first.name, check=False, timeout=150)
    second = run_container(f"{PREFIX}-second", secrets)
    try:
        second.wait_ready()
        record(second_ready_s=round(second.ready_s or 0, 1))
        listing = second.exec("ls", "-a", "/var/cache/clip-gateway").stdout.split()
        assert "written-by-the-first-start" in listing, listing
    finally:
        podman("rm", "-f", "-v", "-t", "0", second.name, check=False)
