"""What a `pip install clip-gateway` user gets: the SDK and the CLI, none of the server."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from clip_gateway.client import AsyncClient, Client, ClientError, compact


@pytest.mark.parametrize(
    "module",
    [
        "litestar",
        "uvicorn",
        "tritonclient",
        "opentelemetry",
        "torch",
        "open_clip",
        "msgspec",
        "ray",
        "pyarrow",
    ],
)
def test_no_server_or_export_dependency_is_installed(module: str) -> None:
    assert importlib.util.find_spec(module) is None


def clip_gateway(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["clip-gateway", *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300, check=False)  # fmt: skip


def test_the_cli_answers_help_with_defaults() -> None:
    done = clip_gateway("--help")
    assert done.returncode == 0, done.stderr
    assert all(command in done.stdout for command in ("embed", "search", "dupes", "serve"))
    embed = " ".join(clip_gateway("embed", "--help").stdout.split())
    assert "default: 32" in embed and "env var: CLIP_GATEWAY_URL" in embed
    assert clip_gateway("--version").stdout.startswith("clip-gateway, version ")


def test_phone_formats_are_readable_in_a_plain_install() -> None:
    from PIL import features

    assert features.check("avif")  # Pillow's own wheels decode AVIF
    assert importlib.util.find_spec("pillow_heif") is not None  # HEIC


def test_the_cli_on_a_messy_folder(url: str, tmp_path: Path) -> None:
    from messy import build  # type: ignore[import-not-found]

    folder = build(tmp_path / "Pictures", locked=False)
    out = tmp_path / "pictures.npz"
    done = clip_gateway("embed", str(folder.root), "--out", str(out), CLIP_GATEWAY_URL=url)
    assert done.returncode == 3, done.stdout + done.stderr  # some files could not be read
    assert "Traceback" not in done.stdout + done.stderr
    with np.load(out) as library:
        assert set(library["paths"]) == {str(p) for p in folder.photos}
        assert set(library["failed_paths"]) == {str(p) for p in folder.failed}
    for path, reason in folder.failed.items():
        assert f"  {path}: {reason}" in done.stdout
    query = next(p for p in folder.photos if p.suffix == ".HEIC")
    found = clip_gateway("search", str(out), "--image", str(query), "--top", "2",
                         CLIP_GATEWAY_URL=url)  # fmt: skip
    assert found.returncode == 0, found.stderr
    assert found.stdout.splitlines()[0].split()[::2] == ["1", str(query)]


def test_an_unreachable_gateway_has_its_own_exit_code(tmp_path: Path) -> None:
    import socket

    (tmp_path / "a.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    with socket.socket() as bound:  # bound, never listening: connections are refused
        bound.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{bound.getsockname()[1]}"
        done = clip_gateway("embed", str(tmp_path), "--out", str(tmp_path / "x.npz"), "--url", url)
    assert done.returncode == 4
    assert "could not reach the gateway" in done.stderr and "Traceback" not in done.stderr


def test_serve_says_which_extra_it_needs() -> None:
    done = clip_gateway("serve")
    assert done.returncode == 2
    assert "clip-gateway[server]" in done.stderr
    assert "Traceback" not in done.stderr


def test_bulk_says_which_extra_it_needs(tmp_path: Path) -> None:
    done = clip_gateway("bulk", str(tmp_path), str(tmp_path / "out"), "--gateway", "http://gw")
    assert done.returncode == 2
    assert "bulk needs the bulk extra: pip install 'clip-gateway[bulk]'" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


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
        [
            sys.executable,
            "-m",
            "clip_gateway",
            "embed",
            str(folder),
            "--out",
            str(out),
            "--url",
            url,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    with np.load(out) as library:
        assert len(library["paths"]) == 5 and library["embeddings"].shape == (5, 512)
