"""``clip-gateway bulk`` as users run it: the CLI (a Ray driver) joining a real local Ray cluster
(2 CPUs, a 100 MB object store: one start for the module), a real gateway on the session's
Triton (random weights), real files: webdataset shards with messy members, Parquet, a folder,
and object storage through a real S3 protocol server on loopback (moto's server mode). Every
input must end in exactly one row or one failure, with the embedding the gateway gives for the
same bytes directly; and so after a Ray worker, the driver or a gateway is killed mid-job."""

from __future__ import annotations

import contextlib
import http.server
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import httpx
import numpy as np
import pyarrow.parquet as pq
import pytest

from clip_gateway.client import Client
from clip_gateway.config.processes import GatewayProcess, reserve_port
from tests import bulk_data
from tests.bulk_data import Sample

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def bulk_gateway(triton, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    log = tmp_path_factory.mktemp("bulk-gateway") / "gateway.log"
    env = {"GATEWAY_MAX_ITEMS_PER_REQUEST": "64", "GATEWAY_DECODE_THREADS": "2"}
    with GatewayProcess(triton.grpc_url, env=env, log_path=log) as process:
        process.wait_ready()
        yield process


@pytest.fixture(scope="module")
def quick_gateway(
    control_triton, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:  # type: ignore[no-untyped-def]
    """A real gateway in front of a real Triton serving the control model (tests/models/
    control.py: a cheap embedding bound to each image's pixels and each text's tokens), for the
    2,048-image job: the bulk job's reading, batching, fleet and output are what it tests, and
    ViT-B/32 on two CPUs would spend minutes of CI on the model alone (the smaller jobs below
    run on it)."""
    server, _ = control_triton
    log = tmp_path_factory.mktemp("quick-gateway") / "gateway.log"
    env = {"GATEWAY_MAX_ITEMS_PER_REQUEST": "64", "GATEWAY_DECODE_THREADS": "2",
           "GATEWAY_CANARY_INTERVAL_S": "0"}  # fmt: skip
    with GatewayProcess(server.grpc_url, env=env, log_path=log) as process:
        process.wait_ready()
        yield process


class RayHead(NamedTuple):
    address: str
    #: What a driver needs to join it: the head's own token (not ~/.ray's, which other Ray
    #: users of this machine share).
    env: dict[str, str]


@pytest.fixture(scope="module")
def ray_head() -> Iterator[RayHead]:
    """A real Ray head (``ray start --head --block``, its own session, stopped by its process
    group at the end) on loopback: 2 CPUs, a 100 MB object store, ports reserved here."""
    port, client, agent = reserve_port(), reserve_port(), reserve_port()
    env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}
    temp = tempfile.mkdtemp(prefix="ray-bulk-", dir="/tmp")
    command = [
        str(Path(sys.executable).parent / "ray"),
        "start",
        "--head",
        "--block",
        f"--port={port.port}",
        "--node-ip-address=127.0.0.1",
        "--num-cpus=2",
        f"--object-store-memory={100 << 20}",
        f"--ray-client-server-port={client.port}",
        "--include-dashboard=false",
        f"--dashboard-agent-listen-port={agent.port}",
        "--disable-usage-stats",
        f"--temp-dir={temp}",
    ]
    log = open(Path(temp) / "head.log", "ab")  # noqa: SIM115 (the head's whole life)
    head = subprocess.Popen(
        command,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, **env},
    )
    for reserved in (port, client, agent):
        reserved.release()  # the head binds them now
    try:
        yield RayHead(f"127.0.0.1:{port.port}", env)
    finally:
        # SIGTERM first (the head stops its processes), then the whole group: `ray start
        # --block` can take half a minute to go by itself, and nothing of it is worth keeping
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            head.wait(5)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGKILL)
        head.wait()
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def bulk(ray: RayHead, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """The CLI in a child (a Ray driver joining ``ray``), stdout and stderr together."""
    return subprocess.Popen(
        [sys.executable, "-m", "clip_gateway", "bulk", *args, "--ray-address", ray.address],
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, **ray.env, **(env or {})},
        start_new_session=True,
    )


def finish(process: subprocess.Popen[str], timeout: float = 600) -> tuple[int, str]:
    out, _ = process.communicate(timeout=timeout)
    return process.returncode, out


class Output:
    """A job's output folder read back: rows and failures by key."""

    def __init__(self, root: str, fs=None) -> None:  # type: ignore[no-untyped-def]
        import fsspec

        self.fs, self.root = (fs, root) if fs else fsspec.core.url_to_fs(root)
        names = sorted(
            p.rsplit("_", 1)[1].removesuffix(".npy")
            for p in self.fs.glob(f"{self.root}/img_emb/img_emb_*.npy")
        )
        self.images, self.texts, self.meta = [], [], []
        for name in names:
            self.images.append(self._npy(f"img_emb/img_emb_{name}.npy"))
            if self.fs.exists(f"{self.root}/text_emb/text_emb_{name}.npy"):
                self.texts.append(self._npy(f"text_emb/text_emb_{name}.npy"))
            with self.fs.open(f"{self.root}/metadata/metadata_{name}.parquet", "rb") as f:
                self.meta += pq.read_table(f).to_pylist()
        self.failures = []
        for path in sorted(self.fs.glob(f"{self.root}/failures/failures_*.parquet")):
            with self.fs.open(path, "rb") as f:
                self.failures += pq.read_table(f).to_pylist()
        self.image = np.concatenate(self.images) if self.images else np.empty((0, 0))
        self.text = np.concatenate(self.texts) if self.texts else None
        for array in self.images:
            assert array.shape[0] > 0
        assert len(self.meta) == len(self.image)
        self.row = {m["key"]: i for i, m in enumerate(self.meta)}
        self.failed = {f["key"]: f for f in self.failures}

    def _npy(self, relative: str) -> np.ndarray:
        with self.fs.open(f"{self.root}/{relative}", "rb") as f:
            return np.load(f)


def check_exactly_once(out: Output, found: list[Sample]) -> None:
    """Every input in exactly one row or one failure, as each sample says it must be."""
    keys = [m["key"] for m in out.meta] + [f["key"] for f in out.failures]
    assert Counter(keys) == Counter(s.key for s in found)  # nothing lost, nothing twice
    for sample in found:
        if sample.fails is None:
            assert sample.key in out.row, (sample.key, out.failed.get(sample.key))
        else:
            assert out.failed[sample.key]["type"] == sample.fails, out.failed[sample.key]
            assert out.failed[sample.key]["detail"]


def direct(url: str, found: list[Sample]) -> np.ndarray:
    """What the gateway answers for the same bytes, through the SDK (one request at a time: the
    SDK fails on a 429 its retries do not outlast, where the job slows)."""
    with Client(url, batch_size=16, concurrency=1) as client:
        answer = client.embed_valid([s.data for s in found if s.data is not None])
    assert not answer.errors
    return answer.vectors


def direct_texts(url: str, texts: list[str]) -> np.ndarray:
    with Client(url, concurrency=1) as client:
        return np.concatenate(
            [client.embed_texts(texts[i : i + 32]) for i in range(0, len(texts), 32)]
        )


def test_webdataset_2000_images_in_8_shards_then_a_second_run_does_nothing(
    quick_gateway: GatewayProcess, ray_head: RayHead, tmp_path: Path
) -> None:
    bulk_gateway = quick_gateway
    found = bulk_data.collection(2048, seed=1)
    bulk_data.write_webdataset(tmp_path / "in", found, 8)
    dst = tmp_path / "out"
    code, log = finish(
        bulk(
            ray_head,
            str(tmp_path / "in"),
            str(dst),
            "--gateway",
            bulk_gateway.url,
            "--workers",
            "2",
        )
    )
    assert code == 3, log  # done, and some inputs failed (each named)
    assert "8 shards written, 0 done before, 0 left" in log
    out = Output(str(dst))
    check_exactly_once(out, found)
    kinds = Counter(s.fails for s in found if s.fails)
    assert kinds == {bulk_data.INVALID: 18, "no-image": 9}  # truncated, text as .jpg; orphans
    assert f"invalid-image: {kinds[bulk_data.INVALID]}, no-image: 9" in log
    assert out.image.dtype == np.float16 and out.image.shape == (len(out.meta), 512)
    # the same embeddings as the gateway gives for the same bytes: every 32nd, every PNG/WebP
    picked = [s for i, s in enumerate(found) if s.fails is None and (i % 32 == 0 or s.ext != "jpg")]
    rows = out.image[[out.row[s.key] for s in picked]].astype(np.float32)
    np.testing.assert_allclose(rows, direct(bulk_gateway.url, picked), atol=2e-3)
    # captions row for row; zeros where there is none
    assert out.text is not None and out.text.shape == out.image.shape
    captioned = [s for s in picked if s.caption]
    texts = out.text[[out.row[s.key] for s in captioned]].astype(np.float32)
    expected = direct_texts(bulk_gateway.url, [s.caption or "" for s in captioned])
    np.testing.assert_allclose(texts, expected, atol=2e-3)
    bare = [out.row[s.key] for s in found if s.fails is None and s.caption is None]
    assert bare and not out.text[bare].any()
    meta = out.meta[out.row[found[0].key]]
    assert meta == {
        "key": found[0].key,
        "image_path": f"{tmp_path}/in/00000.tar/{found[0].key}.jpg",
        "url": found[0].url,
        "caption": found[0].caption,
        "width": 64,
        "height": 64,
    }

    written = {p: p.stat().st_mtime_ns for p in dst.rglob("*") if p.is_file()}
    code, log = finish(
        bulk(ray_head, str(tmp_path / "in"), str(dst), "--gateway", bulk_gateway.url)
    )
    assert code == 3, log
    assert "0 shards written, 8 done before, 0 left; this run: 0 images embedded" in log
    assert {p: p.stat().st_mtime_ns for p in dst.rglob("*") if p.is_file()} == written


@pytest.mark.parametrize("form", ["parquet", "folder"])
def test_parquet_and_folder_give_the_gateways_embeddings(
    form: str, bulk_gateway: GatewayProcess, ray_head: RayHead, tmp_path: Path
) -> None:
    found = bulk_data.collection(100, seed=2 if form == "parquet" else 3)
    if form == "parquet":
        src = bulk_data.write_parquet(tmp_path / "in" / "part-0.parquet", found, row_group=20)
    else:
        src = bulk_data.write_folder(tmp_path / "in", found)
        # a folder's key is the file's path under SRC less its extension
        found = [replace(s, key=f"part{i % 3}/{s.key}") for i, s in enumerate(found)]
    dst = tmp_path / "out"
    code, log = finish(
        bulk(
            ray_head,
            str(src),
            str(dst),
            "--gateway",
            bulk_gateway.url,
            "--dtype",
            "float32",
            "--shard-size",
            "40",
        )
    )
    assert code == 3, log
    out = Output(str(dst))
    check_exactly_once(out, found)
    good = [s for s in found if s.fails is None]
    rows = out.image[[out.row[s.key] for s in good]]
    assert out.image.dtype == np.float32
    np.testing.assert_allclose(rows, direct(bulk_gateway.url, good), atol=1e-5)
    assert len(out.images) == 3  # 100 inputs, 40 a shard


def test_object_storage_in_and_out(
    bulk_gateway: GatewayProcess, ray_head: RayHead, tmp_path: Path
) -> None:
    """Input and output on a real S3 protocol server on loopback (moto's server mode)."""
    import s3fs
    from moto.server import ThreadedMotoServer

    port = reserve_port()
    port.release()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port.port)
    server.start()
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port.port}",
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    try:
        fs = s3fs.S3FileSystem(key="test", secret="test", endpoint_url=env["AWS_ENDPOINT_URL"])
        fs.mkdir("crawl")
        fs.mkdir("embeddings")
        found = bulk_data.collection(45, seed=4)
        for path in bulk_data.write_webdataset(tmp_path / "in", found, 3):
            fs.put_file(str(path), f"crawl/laion/{path.name}")
        args = ("s3://crawl/laion", "s3://embeddings/job-1", "--gateway", bulk_gateway.url)
        code, log = finish(bulk(ray_head, *args, env=env))
        assert code == 3, log
        assert "3 shards written" in log
        out = Output("embeddings/job-1", fs)
        check_exactly_once(out, found)
        assert out.meta[0]["image_path"] == f"s3://crawl/laion/00000.tar/{found[0].key}.jpg"
        good = [s for s in found if s.fails is None]
        np.testing.assert_allclose(
            out.image[[out.row[s.key] for s in good]].astype(np.float32),
            direct(bulk_gateway.url, good),
            atol=2e-3,
        )
        assert len(fs.ls("embeddings/job-1/_job/done")) == 3
        code, log = finish(bulk(ray_head, *args, env=env))
        assert code == 3 and "0 shards written, 3 done before" in log, log
    finally:
        server.stop()


class HoldingProxy:
    """A loopback proxy in front of a gateway that, once ``hold_after`` embedding requests are
    answered, parks the next ones until ``release()``: the test acts (kills something) while
    the job is known to be mid-shard. Upstream unreachable, it drops the client's connection
    without an answer, as a gateway that died would."""

    def __init__(self, upstream: str, hold_after: int | None = None) -> None:
        self.upstream = upstream
        self.hold_after = hold_after
        self.answered = 0
        self.parked = threading.Event()
        self.gate = threading.Event()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.forward(b"")

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if proxy.hold_after is not None and proxy.answered >= proxy.hold_after:
                    proxy.parked.set()
                    proxy.gate.wait(300)
                self.forward(body)

            def forward(self, body: bytes) -> None:
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                try:
                    reply = httpx.request(
                        self.command,
                        proxy.upstream + self.path,
                        content=body,
                        headers=headers,
                        timeout=120,
                    )
                except httpx.TransportError:
                    self.close_connection = True  # the gateway is gone: so is the answer
                    return
                if self.command == "POST":
                    proxy.answered += 1
                with contextlib.suppress(OSError):  # the job that asked may be dead by now
                    self.send_response(reply.status_code)
                    for name in ("content-type", "retry-after"):
                        if name in reply.headers:
                            self.send_header(name, reply.headers[name])
                    self.send_header("content-length", str(len(reply.content)))
                    self.end_headers()
                    self.wfile.write(reply.content)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def release(self) -> None:
        self.hold_after = None
        self.gate.set()

    def close(self) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()


#: The fault tests' job: 4 tar shards of 24 photos, no captions, one worker, one request in
#: flight, 8 photos a request: the first shard is exactly the first 3 requests, and the 5th
#: is the second of shard 1 (the worker takes shards one at a time, in order).
FAULT_SHARDS, FAULT_PER_SHARD, FAULT_BATCH = 4, 24, 8
FIRST_SHARD_REQUESTS = FAULT_PER_SHARD // FAULT_BATCH


def fault_job(tmp_path: Path, url: str) -> tuple[list[Sample], list[str]]:
    found = bulk_data.collection(FAULT_SHARDS * FAULT_PER_SHARD, seed=5, messy=False)
    found = [Sample(s.key, s.ext, s.data, None, None, s.url) for s in found]
    bulk_data.write_webdataset(tmp_path / "in", found, FAULT_SHARDS)
    args = [
        str(tmp_path / "in"),
        str(tmp_path / "out"),
        "--gateway",
        url,
        "--workers",
        "1",
        "--in-flight",
        "1",
        "--batch-size",
        str(FAULT_BATCH),
        "--dtype",
        "float32",
    ]
    return found, args


def worker_pids() -> set[int]:
    """This machine's processes of the bulk job's Ray actor (its process title)."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                title = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
                if b"ray::ShardWorker" in title:
                    pids.add(int(entry.name))
    return pids


def wait_gone(pids: set[int]) -> None:
    """Until none of ``pids`` runs (Ray ends a dead driver's actors), 120 s at most."""
    for _ in range(1200):
        if not pids & worker_pids():
            return
        threading.Event().wait(0.1)
    raise AssertionError(f"Ray workers {pids} still run")


def one_done(out: Path) -> str:
    """The name of the one shard committed so far."""
    (done,) = (out / "_job" / "done").glob("*.json")
    return done.stem


def test_a_ray_worker_killed_mid_job(
    bulk_gateway: GatewayProcess, ray_head: RayHead, tmp_path: Path
) -> None:
    proxy = HoldingProxy(bulk_gateway.url, hold_after=FIRST_SHARD_REQUESTS + 1)
    try:
        found, args = fault_job(tmp_path, proxy.url)
        before = worker_pids()
        job = bulk(ray_head, *args)
        assert proxy.parked.wait(300), "the job never reached its second shard"
        one_done(tmp_path / "out")
        (worker,) = worker_pids() - before
        os.kill(worker, signal.SIGKILL)
        proxy.release()
        code, log = finish(job)
    finally:
        proxy.close()
    assert code == 0, log
    assert "4 shards written, 0 done before, 0 left" in log
    assert worker not in worker_pids()
    out = Output(str(tmp_path / "out"))
    check_exactly_once(out, found)
    np.testing.assert_allclose(
        out.image[[out.row[s.key] for s in found]], direct(bulk_gateway.url, found), atol=1e-5
    )


def test_the_driver_killed_mid_job_and_started_again(
    bulk_gateway: GatewayProcess, ray_head: RayHead, tmp_path: Path
) -> None:
    proxy = HoldingProxy(bulk_gateway.url, hold_after=FIRST_SHARD_REQUESTS + 1)
    try:
        found, args = fault_job(tmp_path, proxy.url)
        before = worker_pids()
        job = bulk(ray_head, *args)
        assert proxy.parked.wait(300), "the job never reached its second shard"
        first = tmp_path / "out" / "img_emb" / f"img_emb_{one_done(tmp_path / 'out')}.npy"
        committed = first.stat().st_mtime_ns
        workers = worker_pids() - before
        os.killpg(job.pid, signal.SIGKILL)  # the driver, and anything it started itself
        finish(job)
        wait_gone(workers)  # Ray ends the job's worker: its parked request answers no one
        proxy.release()
        code, log = finish(bulk(ray_head, *args))
    finally:
        proxy.close()
    assert code == 0, log
    assert "3 shards written, 1 done before, 0 left" in log
    assert first.stat().st_mtime_ns == committed  # the shard done before was not redone
    check_exactly_once(Output(str(tmp_path / "out")), found)


def test_a_gateway_stopped_and_started_again_mid_job(
    triton, ray_head: RayHead, tmp_path: Path
) -> None:
    gateway = GatewayProcess(triton.grpc_url, log_path=tmp_path / "gateway.log").start()
    proxy = HoldingProxy(gateway.url, hold_after=FIRST_SHARD_REQUESTS + 1)
    try:
        gateway.wait_ready()
        found, args = fault_job(tmp_path, proxy.url)
        job = bulk(ray_head, *args)
        assert proxy.parked.wait(300), "the job never reached its second shard"
        gateway.kill()  # SIGKILL: no drain, the parked request's answer never comes
        assert gateway.sock is not None
        gateway.sock.close()  # the port refuses connections, as a dead host's would
        gateway.sock = None
        proxy.release()
        lines: list[str] = []
        assert job.stdout is not None
        for line in job.stdout:  # the job says the gateway left the rotation...
            lines.append(line)
            if "out of rotation" in line:
                break
        gateway.start()  # ...and it comes back on the same port
        code, rest = finish(job)
        log = "".join(lines) + rest
    finally:
        proxy.close()
        gateway.stop()
    assert code == 0, log
    assert f"gateway {proxy.url} out of rotation" in log
    assert f"gateway {proxy.url} back in rotation" in log
    assert "4 shards written, 0 done before, 0 left" in log
    out = Output(str(tmp_path / "out"))
    check_exactly_once(out, found)
