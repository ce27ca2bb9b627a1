"""``/predict`` with an upstream (GATEWAY_IMMICH_UPSTREAM): the app on the fake backend, the
upstream a real stand-in process on loopback (tests/immich_upstream.py). What the gateway does
not serve comes back byte for byte as the stand-in answered it; CLIP stays here; a dead upstream
fails only the forwarded requests, with a problem naming the configured URL."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from litestar.testing import TestClient

from bench.harness.photos import immich_preview
from clip_gateway.config.settings import ServerSettings
from clip_gateway.http.app import create_app
from tests.api.test_immich import NAME, TEXTUAL, VISUAL, predict
from tests.fakes import FakeBackend
from tests.immich_upstream import FACES, OCR, UpstreamProcess, answer


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamProcess]:
    with UpstreamProcess() as process:
        yield process


def gateway(settings: ServerSettings, fake: FakeBackend, *urls: str) -> TestClient:
    on = settings.model_copy(
        update={
            "immich": True,
            "immich_aliases": (NAME,),
            "immich_upstream": urls,
            "immich_upstream_timeout_s": 20.0,
        }
    )
    return TestClient(create_app(on, lambda *_: fake))


@pytest.fixture
def one_url(
    settings: ServerSettings, fake: FakeBackend, upstream: UpstreamProcess
) -> Iterator[TestClient]:
    with gateway(settings, fake, upstream.url) as client:
        yield client


def hits(upstream: UpstreamProcess) -> dict[str, int]:
    return dict(httpx.get(f"{upstream.url}/hits").json())


def test_faces_and_ocr_come_back_byte_for_byte(
    one_url: TestClient, upstream: UpstreamProcess
) -> None:
    preview = immich_preview(640, 480, seed=3)
    for entries in (FACES, OCR):
        response = predict(one_url, entries, image=preview)
        assert response.status_code == 200
        assert response.content == answer(entries, preview, None)
        assert response.headers["content-type"] == "application/json"
    faces = predict(one_url, FACES, image=preview).json()
    assert (
        faces["imageWidth"] == 640
        and len(json.loads(faces["facial-recognition"][0]["embedding"])) == 512
    )


def test_clip_stays_here_and_immichs_spelling_of_a_name_is_the_same_model(
    one_url: TestClient, upstream: UpstreamProcess
) -> None:
    before = hits(upstream)
    preview = immich_preview(320, 240, seed=4)
    here = predict(one_url, VISUAL, image=preview)
    assert here.status_code == 200 and len(json.loads(here.json()["clip"])) > 4
    prefixed = {"clip": {"visual": {"modelName": f"immich-app/{NAME}"}}}
    same = predict(one_url, prefixed, image=preview)
    assert same.json()["clip"] == here.json()["clip"]
    assert predict(one_url, TEXTUAL, text="a cat").status_code == 200
    assert hits(upstream) == before  # no CLIP request reached the upstream


def test_another_model_unknown_tasks_and_mixed_requests_go_there_whole(
    one_url: TestClient, upstream: UpstreamProcess
) -> None:
    preview = immich_preview(320, 240, seed=5)
    other = {"clip": {"visual": {"modelName": "ViT-B-16-SigLIP2__webli"}}}
    mixed = {**VISUAL, **FACES}
    unknown = {"image-description": {"captioning": {"modelName": "x"}}}
    for entries in (other, mixed, unknown):
        response = predict(one_url, entries, image=preview)
        assert response.status_code == 200
        assert response.content == answer(entries, preview, None)
    text = predict(one_url, {"clip": {"textual": {"modelName": "nllb-clip-base-siglip__v1"}}},
                   text="ein Hund")  # fmt: skip
    assert text.content == answer({"clip": {"textual": {}}}, None, "ein Hund")


def test_the_upstreams_own_errors_come_back_unchanged(one_url: TestClient) -> None:
    response = predict(one_url, FACES)  # neither image nor text: the upstream's 400
    assert response.status_code == 400
    assert response.json() == {"detail": "Either image or text must be provided"}


def test_an_oversized_forward_is_refused_by_the_gateways_body_limit(
    one_url: TestClient, settings: ServerSettings, upstream: UpstreamProcess
) -> None:
    big = b"\xff" * (settings.max_body_bytes + 1024)
    declared = predict(one_url, FACES, image=big)
    assert declared.status_code == 413

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it streams through
        yield b'--b\r\nContent-Disposition: form-data; name="entries"\r\n\r\n'
        yield json.dumps(FACES).encode() + b"\r\n--b\r\n"
        yield b'Content-Disposition: form-data; name="image"; filename="blob"\r\n\r\n'
        for _ in range(settings.max_body_bytes // (64 << 10) + 2):
            yield b"\xff" * (64 << 10)
        yield b"\r\n--b--\r\n"

    form = {"content-type": "multipart/form-data; boundary=b"}
    streamed = one_url.post("/predict", content=chunks(), headers=form)
    assert streamed.status_code == 413
    assert streamed.headers["content-type"] == "application/problem+json"


@pytest.mark.slow
def test_a_dead_upstream_fails_only_forwards_and_the_status_route_says_so(
    settings: ServerSettings, fake: FakeBackend
) -> None:
    dead = UpstreamProcess().start()
    url = dead.url
    dead.stop()
    with gateway(settings, fake, url) as client:
        preview = immich_preview(320, 240, seed=6)
        faces = predict(client, FACES, image=preview)
        assert faces.status_code == 503
        assert faces.headers["content-type"] == "application/problem+json"
        problem = faces.json()
        assert problem["type"].endswith("/upstream-unavailable") and url in problem["detail"]
        assert "Retry-After" in faces.headers
        assert predict(client, VISUAL, image=preview).status_code == 200
        status = client.get("/immich/upstream").json()
        assert status["upstreams"][0]["url"] == url
        assert status["upstreams"][0]["state"] == "down"
        assert client.get("/ping").text == "pong"


@pytest.mark.slow
def test_upstreams_are_tried_in_order(
    settings: ServerSettings, fake: FakeBackend, upstream: UpstreamProcess
) -> None:
    dead = UpstreamProcess().start()
    dead.stop()
    with gateway(settings, fake, dead.url, upstream.url) as client:
        preview = immich_preview(320, 240, seed=7)
        response = predict(client, OCR, image=preview)
        assert response.content == answer(OCR, preview, None)
        states = {s["url"]: s["state"] for s in client.get("/immich/upstream").json()["upstreams"]}
        assert states == {dead.url: "down", upstream.url: "up"}


def test_without_an_upstream_faces_are_still_refused_for_the_next_url(
    settings: ServerSettings, fake: FakeBackend
) -> None:
    on = settings.model_copy(update={"immich": True, "immich_aliases": (NAME,)})
    with TestClient(create_app(on, lambda *_: fake)) as client:
        assert predict(client, FACES, image=immich_preview(64, 48, seed=1)).status_code == 501
        assert client.get("/immich/upstream").status_code == 404
