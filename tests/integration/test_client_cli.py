"""The client and the photo-library CLI against the real gateway (real Triton behind it)."""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import openai
import pytest

from bench.photos import CAMERA_SIZES, jpeg, photo
from gateway.client import AsyncClient, Client
from gateway.client.library import Library
from tests import samples

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


def cli(*args: str, **kwargs: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gateway.client.cli", *args], cwd=ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kwargs,  # type: ignore[call-overload]
    )  # fmt: skip


def test_embed_interrupt_resume_and_dupes(gateway, folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "library.npz"
    args = ["embed", str(folder), "--out", str(out), "--url", gateway.url,
            "--batch-size", "2", "--concurrency", "1", "--checkpoint-every", "2"]  # fmt: skip
    first = cli(*args)
    deadline = time.monotonic() + 120
    while not out.exists() and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.02)
    first.send_signal(signal.SIGINT)
    output, _ = first.communicate(timeout=120)
    assert first.returncode == 130, output
    partial = Library.load(out)
    total = len(list(folder.rglob("*.*")))
    assert 2 <= len(partial.paths) < total  # a valid checkpoint, not the whole folder

    second = cli(*args)
    output, _ = second.communicate(timeout=300)
    assert second.returncode == 0, output
    assert f"{len(partial.paths)} already in" in output
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
    assert dupes.returncode == 0, output
    names: list[set[str]] = []
    for line in output.splitlines():
        if line.startswith("group "):
            names.append(set())
        elif line.startswith("  "):
            names[-1].add(Path(line.strip()).name)
    assert {"img_03.jpg", "img_03 (copy).jpg"} in names
    assert {"img_05.jpg", "img_05_small.jpg"} in names
    assert all(len(group) == 2 for group in names)  # distinct photos stay apart
    html = report.read_text()
    assert html.count("data:image/jpeg;base64,") == 4
    assert "img_05_small.jpg" in html


def test_openai_client_and_this_client_agree(gateway) -> None:
    images = [samples.compact(i) for i in range(400, 404)]
    openai_client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
    result = openai_client.embeddings.create(
        model="ViT-B-32", input=[base64.b64encode(x).decode() for x in images]
    )
    theirs = np.array([d.embedding for d in result.data], dtype=np.float32)
    with Client(gateway.url, compact=False) as client:
        ours = client.embed(images)
    np.testing.assert_allclose(ours, theirs, atol=1e-6)

    async def run() -> np.ndarray:
        async with AsyncClient(gateway.url, compact=False, batch_size=3) as client:
            return await client.embed(images)

    np.testing.assert_allclose(asyncio.run(run()), ours, atol=1e-6)


def test_compact_upload_keeps_fidelity(gateway, folder: Path) -> None:
    """Shrunk on the client vs the original photo sent whole: what the gateway makes of each."""
    originals = sorted((folder / "2024" / "trip").glob("camera_*.jpg"))
    with Client(gateway.url, compact=False) as plain, Client(gateway.url) as compact:
        full = plain.embed(originals)
        small = compact.embed(originals)
    cosine = np.sum(full * small, axis=1)
    print(f"\ncompact upload fidelity: mean {cosine.mean():.5f} min {cosine.min():.5f}")
    assert cosine.min() >= 0.9995  # measured min 0.99978, mean 0.99984
    sizes = [os.path.getsize(p) for p in originals]
    assert min(sizes) > 1_000_000
