"""What a `pip install clip-gateway` user gets: the SDK and the CLI, none of the server."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gateway.client import AsyncClient, Client, ClientError, compact


@pytest.mark.parametrize(
    "module",
    ["litestar", "uvicorn", "tritonclient", "opentelemetry", "torch", "open_clip", "msgspec"],
)
def test_no_server_or_export_dependency_is_installed(module: str) -> None:
    assert importlib.util.find_spec(module) is None


def test_the_cli_answers_help() -> None:
    done = subprocess.run(["clip-gateway", "--help"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "embed" in done.stdout and "dupes" in done.stdout


def test_serve_says_which_extra_it_needs() -> None:
    done = subprocess.run(["clip-gateway", "serve"], capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert "clip-gateway[server]" in done.stderr
    assert "Traceback" not in done.stderr


def test_embed_against_a_real_server(url: str, jpegs: list[bytes]) -> None:
    with Client(url, batch_size=2) as client:
        vectors = client.embed(jpegs)
    assert vectors.shape == (5, 512) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    again = Client(url, compact=False).embed(jpegs[:1])
    assert float(vectors[0] @ again[0]) > 0.999


def test_async_client_agrees(url: str, jpegs: list[bytes]) -> None:
    import asyncio

    async def run() -> np.ndarray:
        async with AsyncClient(url, batch_size=3) as client:
            return await client.embed(jpegs)

    with Client(url) as client:
        np.testing.assert_allclose(asyncio.run(run()), client.embed(jpegs), atol=1e-6)


def test_a_bad_image_is_a_client_error_naming_it(url: str, jpegs: list[bytes]) -> None:
    with Client(url, retries=0) as client, pytest.raises(ClientError) as refused:
        client.embed([jpegs[0], b"not an image"])
    assert (refused.value.status, refused.value.index) == (422, 1)


def test_compact_shrinks_a_photo(jpegs: list[bytes]) -> None:
    from conftest import jpeg, photo  # type: ignore[import-not-found]

    big = jpeg(photo(4000, 3000, seed=9))
    assert len(compact(big)) < len(big) / 5


def test_the_cli_embeds_a_folder(url: str, jpegs: list[bytes], tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    for i, data in enumerate(jpegs):
        (folder / f"{i}.jpg").write_bytes(data)
    out = tmp_path / "library.npz"
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "embed", str(folder), "--out", str(out), "--url", url],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    with np.load(out) as library:
        assert len(library["paths"]) == 5 and library["embeddings"].shape == (5, 512)
