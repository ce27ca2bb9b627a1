"""Texts through the whole app on the fake backend: the API forms, mixed batches in request
order, usage, per-item errors, and a model that embeds images only.

The fake's text embedding is a function of the token ids (tests/fakes.py ``embed_tokens``), so
the expected rows are computed from open_clip's own tokenizer (tests/reference.py), never from
the gateway's."""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np
import pytest
from litestar.testing import TestClient

from clip_gateway.config.settings import ServerSettings
from clip_gateway.http.app import create_app
from tests import reference, samples
from tests.api.test_bad_input import problem
from tests.api.test_embeddings import embed_one, vectors
from tests.fakes import FakeBackend, embed_tokens

TEXTS = ["a photo of a cat", "Ein Hund im Schnee, 🐕", "東京の夜景", "x " * 200]


def expected_texts(texts: list[str]) -> np.ndarray:
    rows = embed_tokens(reference.tokens(texts).astype(np.int32), 512)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def data_uri(image: bytes) -> str:
    return "data:image/jpeg;base64," + base64.b64encode(image).decode()


def test_json_texts_are_embedded_from_open_clips_tokens(client: TestClient) -> None:
    response = client.post("/v1/embeddings", json={"input": TEXTS, "model": "ViT-B-32"})
    assert response.status_code == 200, response.text[:500]
    body = response.json()
    np.testing.assert_allclose(vectors(body), expected_texts(TEXTS), atol=1e-6)
    assert [row["index"] for row in body["data"]] == [0, 1, 2, 3]
    # tokens the model read: start + text + end, the long one truncated to the context (77)
    lengths = [int(np.argmax(row == 49407)) + 1 for row in reference.tokens(TEXTS)]
    assert lengths[3] == 77
    assert body["usage"] == {"prompt_tokens": sum(lengths), "total_tokens": sum(lengths),
                             "images": 0, "texts": 4}  # fmt: skip


def test_a_single_string_is_one_text(client: TestClient, fake: FakeBackend) -> None:
    body = client.post("/v1/embeddings", json={"input": "a diagram"}).json()
    np.testing.assert_allclose(vectors(body), expected_texts(["a diagram"]), atol=1e-6)
    assert fake.text_calls == [1] and fake.calls == []


def test_mixed_batches_keep_request_order(client: TestClient, fake: FakeBackend) -> None:
    """Texts and images interleaved, in JSON (strings, data URIs, objects) and multipart (text
    fields beside image files): each row is what that item alone would get."""
    images = [samples.compact(i) for i in range(3)]
    payload = {"input": [
        "a cat", data_uri(images[0]), {"text": "a dog"},
        {"image": base64.b64encode(images[1]).decode()}, "a bird", data_uri(images[2]),
    ]}  # fmt: skip
    json_rows = vectors(client.post("/v1/embeddings", json=payload).json())
    files = [
        ("text", (None, b"a cat", "text/plain")),
        ("image", ("0.jpg", images[0], "image/jpeg")),
        ("text", (None, b"a dog", "text/plain")),
        ("image", ("1.jpg", images[1], "image/jpeg")),
        ("text", (None, b"a bird", "text/plain")),
        ("image", ("2.jpg", images[2], "image/jpeg")),
    ]
    form_rows = vectors(client.post("/v1/embeddings", files=files).json())
    texts = expected_texts(["a cat", "a dog", "a bird"])
    singles = np.stack([embed_one(client, image) for image in images])
    expected = np.stack([texts[0], singles[0], texts[1], singles[1], texts[2], singles[2]])
    np.testing.assert_allclose(json_rows, expected, atol=1e-6)
    np.testing.assert_allclose(form_rows, expected, atol=1e-6)
    # one call per model per request: the texts went together, the images together
    assert 3 in fake.text_calls and 3 in fake.calls


def test_more_texts_than_the_text_models_max_batch_are_split_in_order(
    client: TestClient, fake: FakeBackend
) -> None:
    texts = [f"photo number {i}" for i in range(10)]  # the fake's max batch is 4
    rows = vectors(client.post("/v1/embeddings", json={"input": texts}).json())
    np.testing.assert_allclose(rows, expected_texts(texts), atol=1e-6)
    assert sorted(fake.text_calls) == [2, 4, 4]


def test_binary_and_base64_answers_for_texts(client: TestClient) -> None:
    binary = client.post("/v1/embeddings", json={"input": TEXTS[:2]},
                         headers={"Accept": "application/octet-stream"})  # fmt: skip
    assert binary.headers["x-embedding-shape"] == "2,512"
    got = np.frombuffer(binary.content, "<f4").reshape(2, 512)
    np.testing.assert_allclose(got, expected_texts(TEXTS[:2]), atol=1e-6)
    payload = {"input": TEXTS[:2], "encoding_format": "base64"}
    encoded = client.post("/v1/embeddings", json=payload).json()
    rows = [np.frombuffer(base64.b64decode(r["embedding"]), "<f4") for r in encoded["data"]]
    np.testing.assert_allclose(np.stack(rows), got, atol=0)


def test_raw_text_embeddings_with_normalize_false(client: TestClient) -> None:
    raw = vectors(client.post("/v1/embeddings", json={"input": ["a cat"], "normalize": False})
                  .json())  # fmt: skip
    expected = embed_tokens(reference.tokens(["a cat"]).astype(np.int32), 512)
    np.testing.assert_allclose(raw, expected, atol=1e-6)


@pytest.mark.parametrize("text", ["", "   ", "\n\t "])
def test_an_empty_text_is_refused_naming_the_item(client: TestClient, text: str) -> None:
    body = problem(client.post("/v1/embeddings", json={"input": ["a cat", text]}), 422,
                   "invalid-text", index=1)  # fmt: skip
    assert "empty" in body["detail"]


def test_an_over_long_text_is_refused_before_tokenising(
    client: TestClient, fake: FakeBackend
) -> None:
    long = "word " * 1000  # 5,000 characters; the limit is 4,096
    body = problem(client.post("/v1/embeddings", json={"input": [long]}), 413,
                   "payload-too-large", index=0)  # fmt: skip
    assert "5000 characters; the limit is 4096" in body["detail"]
    assert fake.text_calls == []


def test_skip_invalid_reports_bad_texts_and_embeds_the_rest(client: TestClient) -> None:
    image = samples.compact(5)
    payload = {"input": ["a cat", "", data_uri(b"not an image"), "x" * 5000, data_uri(image)],
               "skip_invalid": True}  # fmt: skip
    body = client.post("/v1/embeddings", json=payload).json()
    assert [row["index"] for row in body["data"]] == [0, 4]
    assert [(e["index"], e["status"]) for e in body["errors"]] == [(1, 422), (2, 422), (3, 413)]
    np.testing.assert_allclose(vectors(body)[0], expected_texts(["a cat"])[0], atol=1e-6)
    np.testing.assert_allclose(vectors(body)[1], embed_one(client, image), atol=1e-6)
    assert body["usage"]["texts"] == 1 and body["usage"]["images"] == 1


def test_models_lists_modalities_context_and_preprocessing(client: TestClient) -> None:
    (card,) = client.get("/v1/models").json()["data"]
    assert card["modalities"] == ["image", "text"]
    assert (card["embed_dim"], card["image_size"], card["context_length"]) == (512, 224, 77)
    assert card["preprocessing"]["resize_mode"] == "shortest"
    assert card["preprocessing"]["size"] == 224
    assert "text_unavailable" not in card
    assert card["tokenizer"] == {"kind": "clip_bpe", "context_length": 77, "clean": "lower"}


@pytest.fixture
def images_only(settings: ServerSettings) -> TestClient:
    fake = FakeBackend(max_batch_size=4)  # no tokenizer: the model serves images only
    with TestClient(create_app(settings, lambda *_: fake)) as client:
        yield client


def test_a_model_without_a_tokenizer_says_why_texts_are_refused(images_only: TestClient) -> None:
    body = problem(images_only.post("/v1/embeddings", json={"input": ["x", "a cat"],
                   "modality": "text"}), 400, "modality-unavailable", index=0)  # fmt: skip
    assert "embeds images only" in body["detail"] and "no text model" in body["detail"]
    # images still work, and skip_invalid embeds them beside the refused texts
    image = samples.compact(6)
    mixed = images_only.post("/v1/embeddings", json={"input": ["a cat", data_uri(image)],
                             "skip_invalid": True}).json()  # fmt: skip
    assert [row["index"] for row in mixed["data"]] == [1]
    assert [(e["index"], e["status"]) for e in mixed["errors"]] == [(0, 400)]
    (card,) = images_only.get("/v1/models").json()["data"]
    assert card["modalities"] == ["image"] and "context_length" not in card
    assert "no text model" in card["text_unavailable"]


def test_an_unreadable_tokenizer_file_serves_images_and_says_why(
    settings: ServerSettings, tmp_path: Path
) -> None:
    fake = FakeBackend(max_batch_size=4, tokenizer_file=str(tmp_path / "missing.json"))
    with TestClient(create_app(settings, lambda *_: fake)) as client:
        body = problem(client.post("/v1/embeddings", json={"input": ["a cat"]}), 400,
                       "modality-unavailable", index=0)  # fmt: skip
        assert "missing.json cannot be loaded by the gateway" in body["detail"]
        assert client.post("/v1/embeddings", json={"input": [data_uri(samples.compact(1))]}
                           ).status_code == 200  # fmt: skip
        (card,) = client.get("/v1/models").json()["data"]
        assert card["modalities"] == ["image"]


def test_a_request_is_shared_between_the_model_instances_in_order(
    settings: ServerSettings, clip_tokenizer_file: Path
) -> None:
    """Two model instances (the CPU core plan): a request's images and texts are split so both
    get a share instead of one taking the whole batch on its half of the cores; rows stay in
    request order and a lone item is not split."""
    fake = FakeBackend(max_batch_size=8, tokenizer_file=str(clip_tokenizer_file), instances=2)
    images = [samples.compact(i) for i in range(7)]
    texts = [f"photo number {i}" for i in range(5)]
    with TestClient(create_app(settings, lambda *_: fake)) as client:
        body = client.post("/v1/embeddings", json={"input": [data_uri(x) for x in images]})
        rows = vectors(body.json())
        assert sorted(fake.calls) == [3, 4]
        for i, image in enumerate(images):
            one = vectors(client.post("/v1/embeddings", json={"input": [data_uri(image)]}).json())
            np.testing.assert_allclose(rows[i], one[0], atol=1e-6)
        assert fake.calls[2:] == [1] * 7
        text_rows = vectors(client.post("/v1/embeddings", json={"input": texts}).json())
        np.testing.assert_allclose(text_rows, expected_texts(texts), atol=1e-6)
        assert sorted(fake.text_calls) == [2, 3]
