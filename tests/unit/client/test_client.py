"""The client on its own: compact upload, retries honouring Retry-After, errors, import weight."""

from __future__ import annotations

import asyncio
import base64
import email.utils
import io
import json
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import numpy as np
import pytest
import simplejpeg
from PIL import Image

from bench.harness.photos import CAMERA_SIZES, jpeg, photo
from clip_gateway.client import AsyncClient, Client, ClientError, CompactOptions, compact
from clip_gateway.client.core import Retries, retry_after, send
from clip_gateway.imaging.preprocess import DecodeOptions, preprocess
from tests import samples

BIG = jpeg(samples.camera_photo(*CAMERA_SIZES[8], seed=3))


def size(data: bytes) -> tuple[int, int]:
    height, width, _, _ = simplejpeg.decode_jpeg_header(data)
    return width, height


def test_compact_shrinks_big_photos_to_a_small_jpeg() -> None:
    small = compact(BIG)
    assert len(small) < 30_000 < len(BIG)
    # 3264x2448 as open_clip's Resize(224) makes it: the long side truncated, as torchvision does
    assert size(small) == (298, 224)
    _, _, _, subsampling = simplejpeg.decode_jpeg_header(small)
    assert subsampling == "444"


@pytest.mark.parametrize(
    ("dimensions", "mode"),
    [((3264, 2448), "shortest"), ((2448, 3264), "shortest"), ((4000, 2250), "shortest"),
     ((3000, 2000), "longest"), ((2000, 3000), "squash")],
)  # fmt: skip
def test_the_gateway_only_crops_or_pads_a_compact_upload(
    dimensions: tuple[int, int], mode: str
) -> None:
    """The upload is what open_clip's resize makes of the photo, so the gateway's own
    preprocessing of it resamples nothing: its output is the upload's pixels, cropped (or
    padded), and equals what it makes of the upload at a plain crop."""
    card = {"image_size": 224, "preprocessing": {"resize_mode": mode}}
    original = jpeg(samples.camera_photo(*dimensions, seed=5))
    upload = compact(original, CompactOptions().for_model(card))
    pixels = simplejpeg.decode_jpeg(upload, colorspace="RGB")
    height, width = pixels.shape[:2]
    out = np.empty((224, 224, 3), np.uint8)
    preprocess(upload, out, DecodeOptions(size=224, max_pixels=1 << 30, max_bytes=1 << 30,
                                         resize_mode=mode))  # fmt: skip
    if mode == "shortest":
        assert min(width, height) == 224
        top, left = round((height - 224) / 2), round((width - 224) / 2)
        np.testing.assert_array_equal(out, pixels[top : top + 224, left : left + 224])
    elif mode == "longest":
        assert max(width, height) == 224
        top = (224 - height) // 2
        np.testing.assert_array_equal(out[top : top + height], pixels)
    else:  # squash: the client keeps the aspect ratio (the short side), the gateway squashes
        assert min(width, height) == 224


@pytest.mark.parametrize(
    ("card", "square"),
    [
        ({"image_size": 224, "preprocessing": {"resize_mode": "shortest"}}, True),
        ({"image_size": 224, "preprocessing": {"resize_mode": "longest"}}, False),
        ({"image_size": 224, "preprocessing": {"resize_mode": "squash"}}, False),
        ({"image_size": 224}, False),  # an older gateway that does not say how it resizes
    ],
)
def test_a_model_that_crops_the_centre_gets_only_the_centre_square(
    card: dict, square: bool
) -> None:
    """For a short-side resize the upload is the square open_clip's CenterCrop takes of its
    resize (its offsets: 37 of 298), so nothing decoded at the gateway is cut away; not for a
    model that pads or squashes, nor for a gateway that does not say."""
    options = CompactOptions(quality=100).for_model(card)
    assert options.square is square
    image = photo(1600, 1200, seed=4)
    upload = simplejpeg.decode_jpeg(compact(image, options), colorspace="RGB")
    resized = np.asarray(image.resize((298, 224), Image.Resampling.BICUBIC)).astype(int)
    if square:
        assert upload.shape == (224, 224, 3)
        # q100 4:4:4 of the crop vs the crop of the resize: only the JPEG's rounding apart
        assert np.abs(upload - resized[:, 37:261]).mean() < 0.5
    else:  # the whole photo: the long side at 224 for a model that pads, else the short one
        assert upload.shape == ((168, 224, 3) if options.long_side else (224, 298, 3))
    assert not CompactOptions(short_side=256).for_model(card).square  # a larger upload asked for


def test_the_models_interpolation_sizes_the_upload() -> None:
    bilinear = {"image_size": 224, "preprocessing": {"resize_mode": "shortest",
                                                     "interpolation": "bilinear"}}  # fmt: skip
    options = CompactOptions().for_model(bilinear)
    assert options.interpolation == "bilinear"
    image = photo(1600, 1200, seed=2)
    # the centre square of the resize (the model crops it): 37 of 298 off the left
    expected = np.asarray(image.resize((298, 224), Image.Resampling.BILINEAR))[:, 37:261]
    unencoded = CompactOptions(quality=100)
    got = simplejpeg.decode_jpeg(compact(image, replace(options, quality=100)), colorspace="RGB")
    other = simplejpeg.decode_jpeg(compact(image, unencoded), colorspace="RGB")[:, 37:261]
    # q100 4:4:4 is near-lossless: the filter's difference is what shows
    assert np.abs(got.astype(int) - expected).mean() < np.abs(other.astype(int) - expected).mean()


def test_compact_applies_exif_orientation_before_dropping_it() -> None:
    rotated = jpeg(samples.camera_photo(*CAMERA_SIZES[8], seed=3), orientation=6)
    assert size(compact(rotated))[0] < size(compact(rotated))[1]  # now upright: portrait


@pytest.mark.parametrize(
    "image", [samples.compact(0), b"not an image at all"], ids=["already-small", "garbage"]
)
def test_compact_leaves_small_or_unknown_bytes_alone(image: bytes) -> None:
    assert compact(image) is image or compact(image) == image


@pytest.mark.slow
def test_compact_png_and_pil_inputs() -> None:
    png = io.BytesIO()
    photo(1600, 1200, seed=1).convert("RGBA").save(png, "PNG")
    assert min(size(compact(png.getvalue()))) == 224
    assert min(size(compact(photo(1600, 1200, seed=1)))) == 224
    assert compact(BIG, CompactOptions(enabled=False)) is BIG


#: ``GET /v1/models`` of a 224-px model: what the clients ask once to size their uploads.
MODELS = {"object": "list", "data": [{"id": "ViT-B-32", "image_size": 224,
                                      "preprocessing": {"resize_mode": "shortest"}}]}  # fmt: skip


def answers(*responses: httpx.Response) -> tuple[httpx.MockTransport, list[httpx.Request]]:
    """``responses`` to the embedding requests, in order (``seen``); /v1/models answered aside."""
    queue, seen = list(responses), []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json=MODELS)
        seen.append(request)
        return queue.pop(0)

    return httpx.MockTransport(handler), seen


@pytest.mark.parametrize(
    ("card", "side", "long_side"),
    [
        ({"image_size": 224, "preprocessing": {"resize_mode": "shortest"}}, 224, False),
        ({"image_size": 256, "preprocessing": {"resize_mode": "squash"}}, 256, False),
        ({"image_size": 384, "preprocessing": {"resize_mode": "longest"}}, 384, True),
        ({}, 224, False),  # an older gateway that does not say: the 224-px defaults
    ],
)
def test_uploads_are_sized_for_the_served_model(card: dict, side: int, long_side: bool) -> None:
    options = CompactOptions().for_model(card)
    assert (options.short_side, options.long_side) == (side, long_side)
    small = compact(BIG, options)  # 3264x2448
    width, height = size(small)
    assert (width if long_side else height) == side  # never below what the model reads


def test_the_client_asks_the_model_once_and_sizes_uploads_for_it() -> None:
    asked: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        if request.url.path == "/v1/models":
            card = {"id": "m", "image_size": 384, "preprocessing": {"resize_mode": "shortest"}}
            return httpx.Response(200, json={"object": "list", "data": [card]})
        upload = request.content.split(b"\r\n\r\n", 1)[1]
        # 3264x2448 as open_clip's Resize(384) and CenterCrop(384) make it
        assert size(upload) == (384, 384)
        return vectors(1)

    with Client("http://gw", transport=httpx.MockTransport(handler)) as client:
        client.embed([BIG])
        client.embed([BIG])
    assert asked == ["/v1/models", "/v1/embeddings", "/v1/embeddings"]


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


def test_a_retry_after_past_the_wait_bound_ends_the_retries_at_once() -> None:
    """Retries are bounded in number and in total wait: a gateway asking for an hour is not
    waited on (the answer is the caller's at once), nor are waits that add up past the bound."""
    transport, seen = answers(
        httpx.Response(429, headers={"Retry-After": "3600"}, json={"status": 429, "detail": "x"})
    )
    waits: list[float] = []
    client = Client("http://gw", transport=transport, sleep=waits.append)
    with client, pytest.raises(ClientError) as raised:
        client.embed([samples.compact(0)])
    assert raised.value.status == 429 and len(seen) == 1 and waits == []
    transport, seen = answers(
        *[httpx.Response(503, headers={"Retry-After": "50"}, json={"status": 503})] * 4
    )
    client = Client("http://gw", transport=transport, sleep=waits.append)
    with client, pytest.raises(ClientError) as raised:
        client.embed([samples.compact(0)])
    assert waits == [50.0, 50.0] and len(seen) == 3  # a third wait would pass 120 s in all


def test_retry_after_as_seconds_or_an_http_date() -> None:
    def asked(value: str) -> float | None:
        return retry_after(httpx.Response(429, headers={"Retry-After": value}))

    assert asked("7") == 7.0 and asked(" 2.5 ") == 2.5 and asked("-3") == 0.0
    later = email.utils.format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    assert 25 <= (asked(later) or 0) <= 30
    assert asked("Sun, 06 Nov 1994 08:49:37 GMT") == 0.0  # past: at once
    assert asked("soon") is None and retry_after(httpx.Response(429)) is None


def test_send_retries_dropped_connections_and_returns_what_ends_it() -> None:
    """``send`` is the one retry loop: the SDK's, the CLI's (through the SDK) and the bench's
    one-off requests (bench/harness/clients.py ``post``)."""
    calls: list[int] = []

    def request() -> httpx.Response:
        calls.append(len(calls))
        if len(calls) == 1:
            raise httpx.ConnectError("refused")
        if len(calls) == 2:
            return httpx.Response(503, headers={"Retry-After": "4"})
        return httpx.Response(422)  # not worth another try: returned as it is

    waits: list[float] = []
    assert send(request, Retries(max_backoff=0.0), waits.append).status_code == 422
    assert len(calls) == 3 and waits[0] == 0.0 and waits[1] == 4.0

    def dropped() -> httpx.Response:
        raise httpx.ReadError("gone")

    with pytest.raises(httpx.ReadError):
        send(dropped, Retries(times=2), waits.append)


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
        "import sys, clip_gateway.client, clip_gateway.photos.dupes, clip_gateway.photos.library,"
        " clip_gateway.photos.cli, clip_gateway.photos.commands, clip_gateway.photos.report,"
        " clip_gateway.cli.main;"
        "server = {'litestar', 'uvicorn', 'tritonclient', 'msgspec', 'grpc', 'opentelemetry',"
        " 'prometheus_client', 'torch', 'onnxruntime'};"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in server))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_pil_image_input_round_trips() -> None:
    image = Image.new("RGB", (300, 400), (10, 200, 30))
    data = compact(image)
    assert size(data) == (224, 298)


def json_answer(rows: dict[int, float], errors: dict[int, str]) -> httpx.Response:
    """An OpenAI-shaped skip_invalid answer: base64 rows at their request positions."""
    data = [
        {"object": "embedding", "index": i, "embedding": base64.b64encode(
            np.full(4, value, "<f4").tobytes()).decode()}
        for i, value in rows.items()
    ]  # fmt: skip
    problems = [
        {
            "index": i,
            "status": 422,
            "type": "https://clip-gateway.dev/problems/invalid-image",
            "title": "Invalid image",
            "detail": detail,
        }
        for i, detail in errors.items()
    ]
    return httpx.Response(200, json={"object": "list", "data": data, "errors": problems})


def test_embed_valid_keeps_the_good_and_names_the_bad() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers["accept"] == "application/json"
        assert b'name="skip_invalid"\r\n\r\ntrue' in request.content
        parts = request.content.split(b'name="image"')[1:]
        rows = {i: float(p.split(b"__n", 1)[1][:4]) for i, p in enumerate(parts) if b"__n" in p}
        bad = {i: "not an image" for i, p in enumerate(parts) if b"__n" not in p}
        return json_answer(rows, bad)

    images = [b"__n0000", b"junk", b"__n0002", b"__n0003", b"more junk"]
    with Client("http://gw", transport=httpx.MockTransport(handler), batch_size=2,
                compact=CompactOptions(enabled=False)) as client:  # fmt: skip
        answer = client.embed_valid([*images, Path("/nonexistent/photo.jpg")])
    assert answer.indices == [0, 2, 3]
    assert answer.vectors[:, 0].tolist() == [0, 2, 3]
    assert [(e.index, str(e)) for e in answer.errors] == [
        (1, "invalid image: not an image"),
        (4, "invalid image: not an image"),
        (5, "cannot read: No such file or directory"),
    ]
    invalid = "https://clip-gateway.dev/problems/invalid-image"
    assert [e.type for e in answer.errors] == [invalid, invalid, None]  # the gateway's kind


def test_embed_valid_splits_a_request_too_large_as_a_whole() -> None:
    sizes: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        parts = request.content.split(b'name="image"')[1:]
        sizes.append(len(parts))
        if any(b"huge" in p for p in parts):
            too_large = {"status": 413, "title": "Request too large", "detail": "body too large",
                         "type": "https://clip-gateway.dev/problems/payload-too-large"}  # fmt: skip
            return httpx.Response(413, json=too_large)
        return json_answer({i: float(i) for i in range(len(parts))}, {})

    images = [b"a", b"b", b"huge", b"d"]
    with Client("http://gw", transport=httpx.MockTransport(handler),
                compact=CompactOptions(enabled=False)) as client:  # fmt: skip
        answer = client.embed_valid(images)
    assert answer.indices == [0, 1, 3]
    assert [(e.index, e.status, str(e), e.type) for e in answer.errors] == [
        (2, 413, "too large: body too large", "https://clip-gateway.dev/problems/payload-too-large")
    ]
    assert sizes == [4, 2, 2, 1, 1]  # halves, then the half holding the huge one


def test_embed_valid_raises_for_the_request_as_a_whole() -> None:
    transport, _ = answers(httpx.Response(401, json={"status": 401, "detail": "no key"}))
    with Client("http://gw", transport=transport) as client, pytest.raises(ClientError) as raised:
        client.embed_valid([samples.compact(0)])
    assert raised.value.status == 401


def test_texts_go_as_json_with_the_text_modality() -> None:
    seen: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return json_answer({0: 1.0, 1: 2.0}, {})

    with Client("http://gw", transport=httpx.MockTransport(handler)) as client:
        vectors = client.embed_texts(["a cat", "a dog"])
    assert vectors.shape == (2, 4) and vectors[:, 0].tolist() == [1.0, 2.0]
    assert seen[0]["input"] == ["a cat", "a dog"] and seen[0]["modality"] == "text"


def test_model_info_asks_once() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"data": [{"id": "ViT-B-32"}]})

    with Client("http://gw", transport=httpx.MockTransport(handler), api_key="k") as client:
        assert client.model_info()["id"] == "ViT-B-32"
    assert len(seen) == 1
    assert seen[0].url.path == "/v1/models" and seen[0].headers["authorization"] == "Bearer k"
