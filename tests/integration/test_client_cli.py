"""The client and the photo-library CLI against the real gateway (real Triton behind it)."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import openai
import pytest

from bench.harness.photos import CAMERA_SIZES, jpeg, photo
from clip_gateway.client import AsyncClient, Client
from clip_gateway.exits import Exit
from clip_gateway.photos.library import Library
from tests import browser, samples
from tests.client import messy

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("photos")
    (root / "2024" / "trip").mkdir(parents=True)
    for i in range(20):
        image = photo(800, 600, seed=700 + i)
        (root / "2024" / f"img_{i:02d}.jpg").write_bytes(jpeg(image, quality=92))
    for i in range(4):
        big = photo(*CAMERA_SIZES[8], seed=800 + i)
        (root / "2024" / "trip" / f"camera_{i}.jpg").write_bytes(jpeg(big, progressive=i % 2 == 1))
    (root / "2024" / "trip" / "scan.png").write_bytes(samples.png(3))
    (root / "2024" / "trip" / "web.webp").write_bytes(samples.webp(4))
    # an exact copy under another name, and a re-encoded copy (what phones and exports make)
    shutil.copy(root / "2024" / "img_03.jpg", root / "2024" / "trip" / "img_03 (copy).jpg")
    reencoded = jpeg(photo(800, 600, seed=705), quality=60)
    (root / "2024" / "trip" / "img_05_small.jpg").write_bytes(reencoded)
    return root


def interruptible() -> None:
    """``preexec_fn``: SIGINT at its default in the child, as a terminal's Ctrl-C finds it. A
    suite started in the background by a non-interactive shell (``.ci/run &``) runs with SIGINT
    ignored, every child inherits that, and Python then never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def cli(*args: str, **kwargs: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "clip_gateway", *args], cwd=ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=interruptible,
        **kwargs,  # type: ignore[call-overload]
    )  # fmt: skip


def run_cli(
    *args: str, wrapper: tuple[str, ...] = (), **env: str
) -> subprocess.CompletedProcess[str]:
    """The CLI to completion, stdout and stderr apart."""
    return subprocess.run(
        [*wrapper, sys.executable, "-m", "clip_gateway", *args], cwd=ROOT, text=True,
        capture_output=True, timeout=300, env={**os.environ, **env}, check=False,
    )  # fmt: skip


def dupe_groups(output: str) -> list[dict[str, str]]:
    """``dupes`` output as groups of {file name: "keep" | "other"}."""
    found: list[dict[str, str]] = []
    for line in output.splitlines():
        if line.startswith("group "):
            found.append({})
        elif line.startswith("  "):
            mark, path = line.split(maxsplit=1)
            found[-1][Path(path).name] = mark
    return found


class GatedProxy:
    """A loopback HTTP proxy in front of the gateway that answers the first ``open_for``
    embedding requests and parks every later one until ``release()``: a test acts while the
    client is known to be waiting, whatever the machine's speed."""

    def __init__(self, upstream: str, open_for: int) -> None:
        import http.server
        import threading

        import httpx

        self.parked = threading.Event()
        self.gate = threading.Event()
        self.answered = 0
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.command == "POST":
                    if proxy.answered >= open_for:
                        proxy.parked.set()
                        proxy.gate.wait(120)
                    proxy.answered += 1
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                reply = httpx.request(self.command, upstream + self.path, content=body,
                                      headers=headers, timeout=120)  # fmt: skip
                self.send_response(reply.status_code)
                for name in ("content-type", "retry-after"):
                    if name in reply.headers:
                        self.send_header(name, reply.headers[name])
                self.send_header("content-length", str(len(reply.content)))
                self.end_headers()
                self.wfile.write(reply.content)

            do_GET = do_POST = forward

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def release(self) -> None:
        self.gate.set()

    def close(self) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()


def test_embed_interrupt_resume_and_dupes(gateway, folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "library.npz"
    args = ["embed", str(folder), "--out", str(out), "--url", gateway.url,
            "--batch-size", "2", "--concurrency", "1", "--checkpoint-every", "2"]  # fmt: skip
    # the first two requests (two checkpoints of 2 photos) are answered, the third is parked:
    # the interrupt lands while the CLI is waiting on it
    proxy = GatedProxy(gateway.url, open_for=2)
    first = cli(*[proxy.url if a == gateway.url else a for a in args])
    try:
        assert proxy.parked.wait(120), "the CLI never sent its third request"
        assert out.exists()
        first.send_signal(signal.SIGINT)
        output, _ = first.communicate(timeout=120)
    finally:
        proxy.close()
        if first.poll() is None:  # a failed test leaves no process (or open pipe) behind
            first.kill()
            first.communicate(timeout=30)
    assert first.returncode == Exit.INTERRUPTED, output
    assert "Traceback" not in output
    partial = Library.load(out)
    assert len(partial.paths) == 4  # the two checkpoints, nothing from the parked request

    second = cli(*args)
    output, _ = second.communicate(timeout=300)
    assert second.returncode == Exit.OK, output
    assert f"unchanged {len(partial.paths)}," in output  # not read again
    library = Library.load(out)
    assert sorted(library.paths) == sorted(str(p) for p in folder.rglob("*.*"))
    assert library.paths[: len(partial.paths)] == partial.paths  # kept, not redone
    vectors = library.embeddings()
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    where = {Path(p).name: i for i, p in enumerate(library.paths)}
    np.testing.assert_array_equal(vectors[where["img_03.jpg"]], vectors[where["img_03 (copy).jpg"]])

    report = tmp_path / "dupes.html"
    dupes = cli("dupes", str(out), "--threshold", "0.99", "--html", str(report))
    output, _ = dupes.communicate(timeout=120)
    assert dupes.returncode == Exit.OK, output
    names = [set(group) for group in dupe_groups(output)]
    assert {"img_03.jpg", "img_03 (copy).jpg"} in names
    assert {"img_05.jpg", "img_05_small.jpg"} in names
    assert all(len(group) == 2 for group in names)  # distinct photos stay apart
    # the larger of the two is kept (800x600 both for the copies: the first listed)
    assert {"img_05.jpg": "keep", "img_05_small.jpg": "other"} in dupe_groups(output)
    html = report.read_text()
    assert html.count("data:image/jpeg;base64,") == 4
    assert "img_05_small.jpg" in html


def permissions_enforced() -> tuple[str, ...]:
    """A command prefix under which chmod 000 really keeps the CLI out: root bypasses
    permissions through CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH, so those are dropped."""
    if os.geteuid() != 0:
        return ()
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv (util-linux): chmod 000 cannot bite")
    return (setpriv, "--bounding-set", "-dac_override,-dac_read_search")


def test_a_messy_folder_end_to_end(gateway, tmp_path: Path) -> None:
    folder = messy.build(tmp_path / "Pictures")
    out = tmp_path / "pictures.npz"
    wrapper = permissions_enforced()
    try:
        done = run_cli("embed", str(folder.root), "--out", str(out), wrapper=wrapper,
                       CLIP_GATEWAY_URL=gateway.url)  # fmt: skip
        again = run_cli("embed", str(folder.root), "--out", str(out), wrapper=wrapper,
                        CLIP_GATEWAY_URL=gateway.url)  # fmt: skip
    finally:
        messy.unlock(folder)
    print(done.stdout)
    assert done.returncode == Exit.INCOMPLETE, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    library = Library.load(out)
    assert set(library.paths) == {str(p) for p in folder.photos}  # every readable file
    listed = done.stdout.split("not followed:")[0]
    for path, reason in folder.failed.items():  # every unreadable one, named with its reason
        assert f"  {path}: {reason}" in listed
    assert set(library.failures) == {str(p) for p in folder.failed if p.is_file()}
    for loop in folder.loops:
        assert f"  {loop}: symlink loop" in done.stdout
    summary = done.stdout.splitlines()[-1]
    expected = f"embedded {len(folder.photos) - 1}, reused 1 (same content), unchanged 0, "
    assert summary.startswith(expected), summary
    assert f"failed {len(folder.failed)} (" in summary
    assert f"skipped {folder.hidden} hidden and {folder.other} other files" in summary

    assert again.returncode == Exit.INCOMPLETE, again.stdout + again.stderr
    retried, not_retried = again.stdout.split("failed before")
    assert f"unchanged {len(folder.photos)}," in again.stdout
    for path in library.failures:
        assert f"  {path}: " in not_retried and f"  {path}: " not in retried

    fixed = folder.root / "broken" / "empty.jpg"
    fixed.write_bytes(jpeg(photo(400, 300, seed=1)))
    third = run_cli("embed", str(folder.root), "--out", str(out), "--retry-failed",
                CLIP_GATEWAY_URL=gateway.url)  # fmt: skip
    assert third.returncode == Exit.INCOMPLETE
    assert "failed before" not in third.stdout  # all tried again
    assert "could not embed: 3" in third.stdout  # truncated x2 and notes.jpg (unlocked now)
    assert str(fixed) in Library.load(out).paths

    query = folder.root / "2024" / "01-winter" / "IMG_0003.JPG"
    page = tmp_path / "search.html"
    found = run_cli("search", str(out), "--image", str(query), "--top", "3", "--html", str(page),
                CLIP_GATEWAY_URL=gateway.url)  # fmt: skip
    assert found.returncode == Exit.OK, found.stderr
    lines = found.stdout.splitlines()
    assert len(lines) == 3  # results only: progress went to stderr
    rank, score, path = lines[0].split(maxsplit=2)
    assert (rank, path) == ("1", str(query)) and float(score) > 0.999
    assert "IMG_0003_small.jpg" in lines[1]  # the re-encoded copy comes next
    as_json = run_cli("search", str(out), "--image", str(query), "--json", "--url", gateway.url)
    hits = json.loads(as_json.stdout)
    assert [hit["rank"] for hit in hits] == list(range(1, 11))
    assert hits[0]["path"] == str(query)
    assert all(a["score"] >= b["score"] for a, b in itertools.pairwise(hits))

    review = tmp_path / "dupes.html"
    dupes = run_cli("dupes", str(out), "--threshold", "0.99", "--html", str(review))
    assert dupes.returncode == Exit.OK, dupes.stderr
    groups = dupe_groups(dupes.stdout)
    assert {"IMG_0002.JPG", "IMG_0002 copy.JPG"} in [set(g) for g in groups]
    # the 640x480 original is kept over its 320x240 re-encode
    assert {"IMG_0003.JPG": "keep", "IMG_0003_small.jpg": "other"} in groups

    shown = browser.open_page(page, tmp_path)
    assert (shown["images"], shown["broken"], shown["fetched"]) == (3, 0, [])
    assert f"#1 · {float(score):.4f}" in shown["text"] and str(query) in shown["text"]
    shown = browser.open_page(review, tmp_path)
    photos = sum(len(group) for group in groups)
    assert (shown["images"], shown["broken"], shown["fetched"]) == (photos, 0, [])
    assert "keep" in shown["text"] and "640×480" in shown["text"]
    assert str(folder.root / "2024/02-spring/IMG_0003_small.jpg") in shown["text"]
    for html in (page.read_text(), review.read_text()):
        assert "Content-Security-Policy" in html and "http://" not in html
        assert "https://" not in html


def test_search_by_text_ranks_the_library(gateway, folder: Path, tmp_path: Path) -> None:
    """Words through the gateway's text embeddings (issue 16), ranked against the photos."""
    out = tmp_path / "library.npz"
    assert run_cli("embed", str(folder), "--out", str(out), "--url", gateway.url).returncode == 0
    done = run_cli("search", str(out), "a photo of a cat", "--top", "5", "--json",
               "--url", gateway.url)  # fmt: skip
    assert done.returncode == Exit.OK, done.stderr
    hits = json.loads(done.stdout)
    assert [hit["rank"] for hit in hits] == [1, 2, 3, 4, 5]
    assert {hit["path"] for hit in hits} <= set(Library.load(out).paths)
    assert all(-1 <= hit["score"] <= 1 for hit in hits)
    assert all(a["score"] >= b["score"] for a, b in itertools.pairwise(hits))


def test_api_key_from_the_environment(triton, start_gateway, folder: Path, tmp_path: Path) -> None:
    guarded = start_gateway(triton.grpc_url, GATEWAY_API_KEYS='["sesame"]')
    out = tmp_path / "library.npz"
    args = ("embed", str(folder / "2024" / "trip"), "--out", str(out), "--url", guarded.url)
    refused = run_cli(*args)
    assert refused.returncode == Exit.REFUSED, refused.stdout + refused.stderr
    assert "401" in refused.stderr and "CLIP_GATEWAY_API_KEY" in refused.stderr
    assert "Traceback" not in refused.stderr
    accepted = run_cli(*args, CLIP_GATEWAY_API_KEY="sesame")
    assert accepted.returncode == Exit.OK, accepted.stdout + accepted.stderr


def test_openai_client_and_this_client_agree(gateway) -> None:
    images = [samples.compact(i) for i in range(400, 404)]
    openai_client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
    result = openai_client.embeddings.create(
        model="ViT-B-32",
        input=["data:image/jpeg;base64," + base64.b64encode(x).decode() for x in images],
    )
    theirs = np.array([d.embedding for d in result.data], dtype=np.float32)
    with Client(gateway.url, compact=False) as client:
        ours = client.embed(images)
    np.testing.assert_allclose(ours, theirs, atol=1e-6)

    async def run() -> np.ndarray:
        async with AsyncClient(gateway.url, compact=False, batch_size=3) as client:
            return await client.embed(images)

    np.testing.assert_allclose(asyncio.run(run()), ours, atol=1e-6)


def test_embed_valid_names_the_bad_and_agrees_with_embed(gateway) -> None:
    images = [samples.compact(500), b"", samples.compact(501), b"not an image", samples.gif(1)]
    with Client(gateway.url, batch_size=2) as client:
        answer = client.embed_valid(images)
        plain = client.embed([images[0], images[2], images[4]])
    assert answer.indices == [0, 2, 4]  # the GIF is converted on the client
    np.testing.assert_allclose(answer.vectors, plain, atol=1e-6)
    assert [(e.index, e.status, e.title) for e in answer.errors] == [
        (1, 422, "Invalid image"),
        (3, 422, "Invalid image"),
    ]

    async def run() -> list[int]:
        async with AsyncClient(gateway.url, batch_size=2) as client:
            return (await client.embed_valid(images)).indices

    assert asyncio.run(run()) == [0, 2, 4]


def test_compact_upload_keeps_fidelity(gateway, folder: Path) -> None:
    """Shrunk on the client vs the original photo sent whole: what the gateway makes of each."""
    originals = sorted((folder / "2024" / "trip").glob("camera_*.jpg"))
    with Client(gateway.url, compact=False) as plain, Client(gateway.url) as compact:
        full = plain.embed(originals)
        small = compact.embed(originals)
    cosine = np.sum(full * small, axis=1)
    print(f"\ncompact upload fidelity: mean {cosine.mean():.5f} min {cosine.min():.5f}")
    # measured min 0.99985, mean 0.99988 with the centre square (the whole 224-px resize: 0.99983,
    # 0.99986; the earlier 8/7-size 4:2:0 upload: 0.99979, 0.99984)
    assert cosine.min() >= 0.9995
    sizes = [os.path.getsize(p) for p in originals]
    assert min(sizes) > 1_000_000
