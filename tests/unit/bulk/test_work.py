"""What the bulk job's workers send for each image (clip_gateway/bulk/work.py ``_prepare``): the
client SDK's compaction where it shrinks the work, the bytes as they are where it would only
re-encode them), and what a worker keeps of them once they are answered."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import numpy as np
import simplejpeg
from aiohttp import web

from clip_gateway.bulk import sources
from clip_gateway.bulk.work import JobSpec, ShardEmbedder, ShardResult, Slot, _prepare
from clip_gateway.client.compact import CompactOptions

MODEL = {
    "image_size": 224,
    "preprocessing": {"resize_mode": "shortest", "interpolation": "bicubic"},
}


def noisy_jpeg(width: int, height: int, quality: int) -> bytes:
    pixels = np.random.default_rng(7).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return bytes(simplejpeg.encode_jpeg(pixels, quality=quality, colorsubsampling="444"))


def prepared(data: bytes, options: CompactOptions) -> bytes:
    slot = Slot(sources.Item("k", "p", data, None))
    (sent,) = _prepare([slot], options)
    assert isinstance(sent, bytes)
    return sent


def test_a_256_px_jpeg_goes_as_it_is_and_a_larger_photo_is_still_compacted() -> None:
    options = CompactOptions().for_model(MODEL)
    small = noisy_jpeg(256, 256, 100)
    assert len(small) > options.keep_bytes  # the SDK alone would decode and re-encode it
    assert prepared(small, options) == small
    large = noisy_jpeg(600, 448, 95)  # twice the model's side: decoded at a DCT scale
    height, width = simplejpeg.decode_jpeg_header(prepared(large, options))[:2]
    assert min(height, width) == 224  # shrunk to the model's side on the worker


def test_a_worker_keeps_no_image_bytes_once_answered_and_talks_to_a_real_server(
    tmp_path: Path,
) -> None:
    """A shard's slots live until its commit: each image's bytes must go once its batch is
    answered, or a worker holds every photo of the shard (10,000 of 3 MB: 30 GB). The answers
    come from a real HTTP server on loopback, through the fleet's aiohttp connections."""
    folder = tmp_path / "photos"
    folder.mkdir()
    for i in range(70):
        (folder / f"{i:03d}.jpg").write_bytes(noisy_jpeg(64 + i, 64, 90))
    sizes: list[int] = []

    async def embeddings(request: web.Request) -> web.Response:
        form = await request.post()
        images = form.getall("image")
        sizes.append(sum(len(f.file.read()) for f in images))  # type: ignore[union-attr]
        rows = [
            {"index": i, "embedding": base64.b64encode(np.full(4, i, "<f4").tobytes()).decode()}
            for i in range(len(images))
        ]
        return web.json_response({"data": rows})

    async def main() -> tuple[list[Slot], ShardResult]:
        app = web.Application(client_max_size=1 << 24)
        app.router.add_post("/v1/embeddings", embeddings)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        source = sources.Source(str(folder), "folder", sources.Columns())
        spec = JobSpec(source, str(tmp_path / "out"), (f"http://127.0.0.1:{port}",),
                       compact=False, batch_size=32)  # fmt: skip
        embedder = ShardEmbedder(spec)
        try:
            result = ShardResult("s")
            return await embedder._embed(sources.plan(source, 1000)[0], result), result
        finally:
            await embedder.aclose()
            await runner.cleanup()

    slots, result = asyncio.run(main())
    assert len(slots) == 70 and sizes and sum(sizes) == result.bytes_read
    assert all(s.vector is not None for s in slots)
    assert [int(s.vector[0]) for s in slots[:3]] == [0, 1, 2]  # type: ignore[index]
    assert all(s.item.data is None for s in slots)
