"""Immich's ML protocol (GATEWAY_IMMICH) on the fake backend: the routes, Immich's shapes, the
statuses that make Immich's server fail over, and the keys. The expected rows come from
tests/immich_reference.py (Immich's own transform and tokenizer), never from the gateway."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from litestar.testing import TestClient
from pydantic import SecretStr

from bench.harness.photos import immich_preview, jpeg, photo
from clip_gateway.config.settings import ServerSettings
from clip_gateway.http.app import create_app
from clip_gateway.http.context import app_context
from tests import immich_reference, samples
from tests.api.test_bad_input import problem
from tests.fakes import FakeBackend, embed, embed_tokens, projection

NAME = "ViT-B-32__openai"
VISUAL = {"clip": {"visual": {"modelName": NAME}}}
TEXTUAL = {"clip": {"textual": {"modelName": NAME, "options": {"language": "en-US"}}}}


@pytest.fixture
def immich(settings: ServerSettings, fake: FakeBackend) -> Iterator[TestClient]:
    on = settings.model_copy(update={"immich": True, "immich_aliases": (NAME,)})
    with TestClient(create_app(on, lambda *_: fake)) as client:
        yield client


def predict(client: TestClient, entries: object, image: bytes | None = None,
            text: str | None = None):  # fmt: skip
    """A request as Immich's server builds it: FormData with `entries`, then an unnamed Blob
    (``image``, no content type) or a ``text`` field."""
    files: list[tuple[str, tuple[str | None, object, str | None]]] = [
        ("entries", (None, entries if isinstance(entries, str) else json.dumps(entries), None))
    ]
    if image is not None:
        files.append(("image", ("blob", image, "application/octet-stream")))
    if text is not None:
        files.append(("text", (None, text, None)))
    return client.post("/predict", files=files)


def unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.linalg.norm(rows, axis=-1, keepdims=True)


def test_ping_and_root_answer_as_immichs_server(immich: TestClient) -> None:
    ping = immich.get("/ping")
    assert (ping.status_code, ping.text) == (200, "pong")
    assert ping.headers["content-type"].startswith("text/plain")
    assert immich.get("/").json() == {"message": "Immich ML"}


def test_the_routes_are_off_unless_enabled(client: TestClient) -> None:
    assert client.get("/ping").status_code == 404
    assert predict(client, VISUAL, samples.compact(0)).status_code == 404


@pytest.mark.slow
@pytest.mark.parametrize("size", [(1440, 1920), (2160, 1440), (640, 480), (1440, 1440), (300, 900)])
def test_an_image_gets_the_embedding_of_immichs_own_pixels(
    immich: TestClient, size: tuple[int, int]
) -> None:
    """The fake embeds the pixels it is sent: those must be the pixels Immich's transform makes
    (short side to 224 truncated, crop at truncated offsets, bicubic, every pixel decoded)."""
    data = immich_preview(*size, seed=sum(size))
    response = predict(immich, VISUAL, data)
    assert response.status_code == 200, response.text[:300]
    body = response.json()
    assert set(body) == {"clip", "imageHeight", "imageWidth"}
    assert (body["imageWidth"], body["imageHeight"]) == size
    assert isinstance(body["clip"], str)  # a JSON array inside a string
    got = np.array(json.loads(body["clip"]), dtype=np.float64)
    assert got.shape == (512,) and abs(np.linalg.norm(got) - 1) < 1e-6
    expected = unit(embed(immich_reference.pixels(data, 224)[None], projection(512))[0])
    np.testing.assert_allclose(got, expected, atol=2e-5)  # pixels within 1/255 (rounding)


def test_exif_orientation_is_ignored_as_immich_ignores_it(immich: TestClient) -> None:
    data = jpeg(photo(480, 320, seed=3), orientation=6)
    body = predict(immich, VISUAL, data).json()
    assert (body["imageWidth"], body["imageHeight"]) == (480, 320)  # as stored, not turned
    expected = unit(embed(immich_reference.pixels(data, 224)[None], projection(512))[0])
    np.testing.assert_allclose(json.loads(body["clip"]), expected, atol=2e-5)


TEXTS = ["a photo of a cat", "Fish &amp; chips", "  two   spaces\tand a tab ", "Café au lait",
         "“curly quotes”", "<b>bold</b>", "\uff26\uff35\uff2c\uff2c", "x " * 120]  # fmt: skip


@pytest.mark.torch  # the hub's tokenizer.json is rebuilt from open_clip's vocabulary
@pytest.mark.parametrize("text", TEXTS)
def test_a_text_gets_the_ids_immichs_tokenizer_makes(
    immich: TestClient, text: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Immich's ids (its clean_text, then Hugging Face's CLIP tokenizer.json, padded with the
    end token) with the padding as the gateway sends it (zeros: the model reads up to the first
    end token): HTML entities, curly quotes and full-width letters are NOT fixed as open_clip's
    ftfy and html.unescape would."""
    hub = immich_reference.clip_tokenizer_json(tmp_path_factory.getbasetemp() / "hub-clip")
    ids = immich_reference.tokenize([text], hub, "<|endoftext|>", 77)
    end = int(np.argmax(ids[0] == 49407))
    ids[0, end + 1 :] = 0
    response = predict(immich, TEXTUAL, text=text)
    assert response.status_code == 200, response.text[:300]
    assert set(response.json()) == {"clip"}
    got = np.array(json.loads(response.json()["clip"]))
    np.testing.assert_allclose(got, unit(embed_tokens(ids.astype(np.int32), 512)[0]), atol=1e-6)


@pytest.mark.parametrize(
    ("entries", "slug"),
    [
        ("{not json", "unprocessable-request"),
        ("[]", "unprocessable-request"),
        ({"clip": "visual"}, "unprocessable-request"),
        ({"clip": {"visual": {"name": NAME}}}, "unprocessable-request"),
        ({"clip": {"visual": {"modelName": 3}}}, "unprocessable-request"),
        ({"clip": {"visual": {"modelName": NAME, "options": []}}}, "unprocessable-request"),
        ("[" * 8000 + "]" * 8000, "unprocessable-request"),  # nests past the decoder's stack
    ],
)
def test_malformed_entries_are_422(immich: TestClient, entries: object, slug: str) -> None:
    problem(predict(immich, entries, samples.compact(1)), 422, slug)


def test_no_entries_is_422_and_no_input_is_400(immich: TestClient) -> None:
    response = immich.post("/predict", files={"image": ("blob", samples.compact(1), "x/y")})
    problem(response, 422, "unprocessable-request")
    body = problem(predict(immich, VISUAL), 400, "invalid-request")
    assert body["detail"] == "Either image or text must be provided"
    problem(immich.post("/predict", json=VISUAL), 422, "unprocessable-request")


FACES = {"facial-recognition": {"detection": {"modelName": "buffalo_l", "options": {}},
                                "recognition": {"modelName": "buffalo_l"}}}  # fmt: skip
OCR = {"ocr": {"detection": {"modelName": "PP-OCRv5_mobile", "options": {}},
               "recognition": {"modelName": "PP-OCRv5_mobile", "options": {}}}}  # fmt: skip


@pytest.mark.parametrize(
    "entries",
    [FACES, OCR, {**VISUAL, **FACES}, {"clip": {"visual": {"modelName": NAME},
                                                "textual": {"modelName": NAME}}}],
    ids=["faces", "ocr", "clip+faces", "visual+textual"],
)  # fmt: skip
def test_other_tasks_are_501_and_never_reach_the_model(
    immich: TestClient, fake: FakeBackend, entries: dict
) -> None:
    body = problem(predict(immich, entries, samples.compact(2)), 501, "unsupported-task")
    assert "next machine-learning URL" in body["detail"]
    assert fake.calls == [] and fake.text_calls == []


@pytest.mark.parametrize(
    "name", ["ViT-B-16-SigLIP__webli", "ViT-B-32__laion2b_s34b_b79k", "ViT-B-32"]
)
def test_another_model_name_is_409_never_a_vector(
    immich: TestClient, fake: FakeBackend, name: str
) -> None:
    entries = {"clip": {"visual": {"modelName": name}}}
    body = problem(predict(immich, entries, samples.compact(3)), 409, "other-model")
    assert NAME in body["detail"]
    text = {"clip": {"textual": {"modelName": name}}}
    problem(predict(immich, text, text="a cat"), 409, "other-model")
    assert fake.calls == [] and fake.text_calls == []


def test_random_weights_claim_no_immich_name(settings: ServerSettings, fake: FakeBackend) -> None:
    """Without GATEWAY_IMMICH_NAME (the launcher sets it only for pretrained weights) or an
    alias, no name is served: every CLIP request is 409, so Immich goes to its next URL."""
    on = settings.model_copy(update={"immich": True})
    with TestClient(create_app(on, lambda *_: fake)) as client:
        body = problem(predict(client, VISUAL, samples.compact(0)), 409, "other-model")
        assert "GATEWAY_IMMICH_ALIASES" in body["detail"]
        (card,) = client.get("/v1/models").json()["data"]
        assert card["immich_names"] == []


def test_models_lists_the_immich_names(immich: TestClient) -> None:
    (card,) = immich.get("/v1/models").json()["data"]
    assert card["immich_names"] == [NAME]


def test_wrong_input_for_the_type_is_400(immich: TestClient) -> None:
    problem(predict(immich, VISUAL, text="a cat"), 400, "invalid-request")
    problem(predict(immich, TEXTUAL, samples.compact(0)), 400, "invalid-request")


def test_bad_images_are_problems_not_crashes(immich: TestClient) -> None:
    for data, status, slug in [
        (b"not an image at all", 422, "invalid-image"),
        (samples.truncated_jpeg(), 422, "invalid-image"),
        (samples.bmp(0), 415, "unsupported-media-type"),
        (samples.claims_pixels(50_000, 50_000), 422, "image-too-large"),
    ]:
        problem(predict(immich, VISUAL, data), status, slug, index=0)


def test_oversized_fields_are_refused_while_streaming(immich: TestClient) -> None:
    problem(predict(immich, "{" + " " * (20 << 10) + "}", samples.compact(0)), 413,
            "payload-too-large")  # fmt: skip
    problem(predict(immich, TEXTUAL, text="x" * 20_000), 413, "payload-too-large")
    big = b"\xff\xd8\xff" + bytes(2 << 20)
    assert predict(immich, VISUAL, big).status_code == 413
    junk = [("entries", (None, json.dumps(VISUAL))), ("assetId", (None, "x" * (64 << 10)))]
    problem(immich.post("/predict", files=junk), 413, "payload-too-large")
    parts = [("entries", (None, json.dumps(VISUAL)))] + [("other", (None, "x"))] * 10
    problem(immich.post("/predict", files=parts), 413, "payload-too-large")


def test_api_keys_apply_to_predict_but_not_to_the_probe(
    settings: ServerSettings, fake: FakeBackend, clip_tokenizer_file: Path
) -> None:
    """With keys configured Immich's own calls (no key) are refused and it fails over; a proxy
    beside Immich that adds the key gets through (deploy/compose/immich-proxy.yml)."""
    on = settings.model_copy(
        update={"immich": True, "immich_aliases": (NAME,), "api_keys": (SecretStr("k3y"),)}
    )
    with TestClient(create_app(on, lambda *_: fake)) as client:
        assert client.get("/ping").status_code == 200
        problem(predict(client, VISUAL, samples.compact(0)), 401, "unauthorized")
        client.headers["Authorization"] = "Bearer k3y"
        assert predict(client, VISUAL, samples.compact(0)).status_code == 200


def test_aliases_parse_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_IMMICH_ALIASES", "ViT-B-32__openai, ViT-B-32__laion400m_e32")
    monkeypatch.setenv("GATEWAY_IMMICH_NAME", "ViT-B-32__openai")
    assert ServerSettings().immich_names == ("ViT-B-32__openai", "ViT-B-32__laion400m_e32")


def test_predict_reads_its_body_under_the_same_limits_as_embeddings(immich: TestClient) -> None:
    """/predict reads through body.body_of: a compressed body is refused unread (415), as on
    /v1/embeddings, and the bodies-in-flight account is back to zero after each request."""
    files = [("entries", (None, json.dumps(VISUAL))), ("image", ("blob", samples.compact(0)))]
    refused = immich.post("/predict", files=files, headers={"Content-Encoding": "gzip"})
    body = problem(refused, 415, "unsupported-media-type")
    assert "gzip" in body["detail"]
    assert predict(immich, VISUAL, samples.compact(0)).status_code == 200
    service = app_context(immich.app.state).pipeline
    assert service.admission.backlog_s == 0 and not service.admission._receiving
