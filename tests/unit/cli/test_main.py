"""The CLI without a gateway: help, version, usage errors, an unreachable gateway; and what
``embed`` does run after run, against a fake gateway at the transport seam."""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import httpx
import numpy as np
import pytest

from clip_gateway.cli.main import cli, main
from clip_gateway.client import Client
from clip_gateway.exits import Exit
from clip_gateway.photos.embed_folder import Options, embed_folder, summary
from clip_gateway.photos.library import Library
from tests import samples

ROOT = Path(__file__).resolve().parents[3]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "clip_gateway", *args], capture_output=True,
                          text=True, timeout=120, env=env, check=False)  # fmt: skip


@pytest.mark.parametrize("command", ["embed", "search", "dupes"])
def test_every_option_says_what_it_does_and_its_default(command: str) -> None:
    parent = click.Context(cli, info_name="clip-gateway", **cli.context_settings)
    chosen = cli.get_command(parent, command)
    assert chosen is not None
    context = click.Context(chosen, info_name=command, parent=parent)
    records = {}
    for param in chosen.params:
        record = param.get_help_record(context) if isinstance(param, click.Option) else None
        if record is not None and param.name != "help":
            records[param.name] = record[1]
    assert len(records) >= 3
    for name, text in records.items():
        assert len(text.split("[")[0].split()) >= 3, (name, text)  # says what it does
        assert "default:" in text or "required" in text, (name, text)
    if command != "dupes":
        assert "env var: CLIP_GATEWAY_URL" in records["url"]
        assert "default: http://127.0.0.1:8000" in records["url"]
        assert "env var: CLIP_GATEWAY_API_KEY" in records["api_key"]


def test_version_and_exit_codes_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == Exit.OK
    assert capsys.readouterr().out.startswith("clip-gateway, version ")
    assert main(["--help"]) == Exit.OK
    out = capsys.readouterr().out
    assert all(f"  {int(code)}  " in out for code in Exit)
    assert all(name in out for name in ("embed", "search", "dupes", "serve"))


def test_usage_errors_are_exit_2_without_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    not_a_library = tmp_path / "notes.npz"
    not_a_library.write_text("hello")
    for args in (
        ["search", str(not_a_library), "a cat"],
        ["dupes", str(not_a_library)],
        ["embed", str(tmp_path), "--out", str(not_a_library)],
        ["search", str(not_a_library)],  # neither QUERY nor --image
        ["embed", str(tmp_path / "missing"), "--out", "x.npz"],
        ["embed", str(tmp_path), "--out", "x.npz", "--batch-size", "0"],
    ):
        assert main(args) == Exit.USAGE, args
        assert "Error" in capsys.readouterr().err


@pytest.fixture
def nobody_listens() -> Iterator[str]:
    """A loopback URL where connections are refused: a bound port that never listens."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{bound.getsockname()[1]}"


@pytest.mark.slow
def test_an_unreachable_gateway_is_exit_4(nobody_listens: str, tmp_path: Path) -> None:
    (tmp_path / "a.jpg").write_bytes(samples.compact(0))
    out = tmp_path / "lib.npz"
    done = run("embed", str(tmp_path), "--out", str(out), "--url", nobody_listens)
    assert done.returncode == Exit.UNREACHABLE
    assert f"could not reach the gateway at {nobody_listens}" in done.stderr
    assert "Traceback" not in done.stderr
    Library().save(out)
    done = run("search", str(out), "a cat", "--url", nobody_listens)
    assert done.returncode == Exit.UNREACHABLE and "Traceback" not in done.stderr


class FakeGateway:
    """Answers like the gateway: a vector from each image's bytes; b"bad" is refused."""

    def __init__(self) -> None:
        self.images_seen = 0
        self.transport = httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "ViT-B-32"}]})
        boundary = request.headers["content-type"].split("boundary=")[1].encode()
        parts = [
            segment.split(b"\r\n\r\n", 1)[1][:-2]  # the content, less the CRLF before "--"
            for segment in request.content.split(b"--" + boundary)
            if b'name="image"' in segment
        ]
        self.images_seen += len(parts)
        data, errors = [], []
        for i, part in enumerate(parts):
            if part.endswith(b"bad"):
                errors.append({"index": i, "status": 422, "title": "Invalid image",
                               "detail": "corrupt"})  # fmt: skip
                continue
            seed = int.from_bytes(hashlib.sha256(part).digest()[:4], "big")
            row = np.random.default_rng(seed).standard_normal(8).astype("<f4")
            data.append({"index": i, "embedding": base64.b64encode(row.tobytes()).decode()})
        return httpx.Response(200, json={"data": data, "errors": errors})


def test_embed_runs_resume_reuse_and_remember_failures(tmp_path: Path) -> None:
    folder, out, fake = tmp_path / "photos", tmp_path / "lib.npz", FakeGateway()
    folder.mkdir()
    for i in range(3):
        (folder / f"{i}.jpg").write_bytes(samples.compact(i))
    (folder / "copy.jpg").write_bytes(samples.compact(1))
    (folder / "broken.jpg").write_bytes(samples.compact(9)[:100] + b"bad")
    (folder / "empty.jpg").write_bytes(b"")

    def embed(**options: bool) -> tuple[Library, object]:
        with Client("http://gw", transport=fake.transport, batch_size=2) as client:
            return embed_folder(folder, out, client, Options(checkpoint_every=2, **options))

    library, report = embed()
    assert (report.embedded, report.reused, report.unchanged) == (3, 1, 0)
    assert sorted(p for p, _ in report.failed) == [
        str(folder / "broken.jpg"),
        str(folder / "empty.jpg"),
    ]
    assert fake.images_seen == 4  # the copy's content was sent once
    where = {Path(p).name: i for i, p in enumerate(library.paths)}
    vectors = library.embeddings()
    np.testing.assert_array_equal(vectors[where["1.jpg"]], vectors[where["copy.jpg"]])
    assert set(Library.load(out).failures) == {
        str(folder / "broken.jpg"),
        str(folder / "empty.jpg"),
    }

    seen = fake.images_seen
    library, report = embed()
    assert fake.images_seen == seen  # nothing unchanged is sent again, failures included
    assert (report.embedded, report.unchanged, len(report.failed_before)) == (0, 4, 2)
    assert not report.complete
    lines = summary(report, library, out)
    assert (
        lines[0].startswith("failed before, unchanged, not retried")
        and "(--retry-failed" in lines[0]
    )
    assert "failed 2 (empty file: 1, invalid image: 1)" in lines[-1]

    (folder / "0.jpg").write_bytes(samples.compact(5))  # changed
    (folder / "2.jpg").unlink()  # deleted
    library, report = embed(retry_failed=True)
    assert (report.embedded, report.unchanged, report.removed) == (1, 2, 1)
    assert fake.images_seen == seen + 2  # the changed photo and the broken one, tried again
    assert str(folder / "2.jpg") not in library.paths and len(library.paths) == 3
    assert [p for p, _ in report.failed_before] == [] and len(report.failed) == 2
