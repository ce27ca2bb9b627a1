"""The client on its own: compact upload, retries honouring Retry-After, errors, import weight."""

from __future__ import annotations

import asyncio
import io
import subprocess
import sys

import httpx
import numpy as np
import pytest
import simplejpeg
from PIL import Image

from bench.photos import CAMERA_SIZES, jpeg, photo
from gateway.client import AsyncClient, Client, ClientError, CompactOptions, compact
from tests import samples

BIG = jpeg(photo(*CAMERA_SIZES[8], seed=3))


def size(data: bytes) -> tuple[int, int]:
    height, width, _, _ = simplejpeg.decode_jpeg_header(data)
    return width, height


def test_compact_shrinks_big_photos_to_a_small_jpeg() -> None:
    small = compact(BIG)
    assert len(small) < 30_000 < len(BIG)
    assert min(size(small)) == 256
    assert size(small)[0] > size(small)[1]  # landscape kept


def test_compact_applies_exif_orientation_before_dropping_it() -> None:
    rotated = jpeg(photo(*CAMERA_SIZES[8], seed=3), orientation=6)
    assert size(compact(rotated))[0] < size(compact(rotated))[1]  # now upright: portrait


@pytest.mark.parametrize(
    "image", [samples.compact(0), b"not an image at all"], ids=["already-small", "garbage"]
)
def test_compact_leaves_small_or_unknown_bytes_alone(image: bytes) -> None:
    assert compact(image) is image or compact(image) == image


def test_compact_png_and_pil_inputs() -> None:
    png = io.BytesIO()
    photo(1600, 1200, seed=1).convert("RGBA").save(png, "PNG")
    assert min(size(compact(png.getvalue()))) == 256
    assert min(size(compact(photo(1600, 1200, seed=1)))) == 256
    assert compact(BIG, CompactOptions(enabled=False)) is BIG


def answers(*responses: httpx.Response) -> tuple[httpx.MockTransport, list[httpx.Request]]:
    queue, seen = list(responses), []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return queue.pop(0)

    return httpx.MockTransport(handler), seen


def vectors(n: int) -> httpx.Response:
    data = np.arange(n * 4, dtype="<f4").reshape(n, 4)
    return httpx.Response(200, content=data.tobytes(), headers={"X-Embedding-Shape": f"{n},4"})


def test_retries_429_and_503_honouring_retry_after() -> None:
    transport, seen = answers(
        httpx.Response(429, headers={"Retry-After": "3"}, json={"status": 429}),
        httpx.Response(503, headers={"Retry-After": "1"}, json={"status": 503}),
        vectors(2),
    )
    waits: list[float] = []
    with Client("http://gw", transport=transport, sleep=waits.append, api_key="k") as client:
        got = client.embed([samples.compact(0), samples.compact(1)])
    assert got.shape == (2, 4)
    assert len(seen) == 3
    assert waits[0] >= 3 and waits[1] >= 1  # never sooner than the server asked
    request = seen[0]
    assert request.headers["authorization"] == "Bearer k"
    assert request.headers["accept"] == "application/octet-stream"
    assert request.headers["content-type"].startswith("multipart/form-data")


def test_gives_up_after_the_retry_budget() -> None:
    transport, seen = answers(*[httpx.Response(503, json={"detail": "busy"}) for _ in range(4)])
    client = Client("http://gw", transport=transport, sleep=lambda _: None, retries=3)
    with client, pytest.raises(ClientError) as raised:
        client.embed([samples.compact(0)])
    assert raised.value.status == 503 and len(seen) == 4


def test_client_errors_are_not_retried_and_carry_the_problem() -> None:
    problem = {"status": 422, "title": "Invalid image", "detail": "not an image", "index": 1}
    transport, seen = answers(httpx.Response(422, json=problem))
    client = Client("http://gw", transport=transport)
    with client, pytest.raises(ClientError, match="not an image") as raised:
        client.embed([samples.compact(0), b"junk"])
    assert raised.value.index == 1 and len(seen) == 1


def test_batches_keep_input_order_across_requests() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        count = request.content.count(b"Content-Disposition")
        first = int(request.content.split(b"__n", 1)[1][:4]) if b"__n" in request.content else 0
        rows = np.arange(first, first + count, dtype="<f4")[:, None].repeat(4, axis=1)
        return httpx.Response(
            200, content=rows.tobytes(), headers={"X-Embedding-Shape": f"{count},4"}
        )

    images = [b"__n" + f"{i:04d}".encode() for i in range(10)]
    options = CompactOptions(enabled=False)
    with Client("http://gw", transport=httpx.MockTransport(handler), batch_size=3,
                compact=options) as client:  # fmt: skip
        got = client.embed(images)
    assert got[:, 0].tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]


def test_async_client_retries_too() -> None:
    transport, seen = answers(
        httpx.Response(429, headers={"Retry-After": "2"}, json={"status": 429}), vectors(1)
    )

    async def run() -> tuple[np.ndarray, list[float]]:
        waits: list[float] = []

        async def sleep(seconds: float) -> None:
            waits.append(seconds)

        async with AsyncClient("http://gw", transport=httpx.MockTransport(transport.handler),
                               sleep=sleep) as client:  # fmt: skip
            return await client.embed([samples.compact(0)]), waits

    got, waits = asyncio.run(run())
    assert got.shape == (1, 4) and waits[0] >= 2 and len(seen) == 2


def test_importing_the_client_pulls_in_no_server_dependency() -> None:
    code = (
        "import sys, gateway.client, gateway.client.dupes, gateway.client.library;"
        "server = {'litestar', 'uvicorn', 'tritonclient', 'msgspec', 'grpc', 'opentelemetry',"
        " 'prometheus_client', 'torch', 'onnxruntime'};"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in server))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_pil_image_input_round_trips() -> None:
    image = Image.new("RGB", (300, 400), (10, 200, 30))
    data = compact(image)
    assert size(data) == (256, 341)
