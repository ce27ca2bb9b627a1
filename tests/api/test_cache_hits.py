"""The content-addressed embedding cache through the real app on the fake backend: a repeated
image or text is answered without a decode or a model call, with the very vector the model
gave; another model or another preprocessing never gets it."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from litestar.testing import TestClient

from clip_gateway.config.settings import ServerSettings
from clip_gateway.http.app import create_app
from tests import samples
from tests.fakes import FakeBackend
from tests.metrics import sample, sample_or_zero


def cached(settings: ServerSettings, **changes: object) -> ServerSettings:
    return settings.model_copy(update={"cache_mib": 8, **changes})


def embed(client: TestClient, *images: bytes, texts: tuple[str, ...] = ()) -> np.ndarray:
    files = [("image", (f"{i}.jpg", image, "image/jpeg")) for i, image in enumerate(images)]
    files += [("text", (None, text)) for text in texts]  # type: ignore[misc]
    response = client.post("/v1/embeddings", files=files, params={"normalize": "false"})
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]  # hits or not, every item answered is counted
    assert (usage["images"], usage["texts"]) == (len(images), len(texts))
    return np.array([row["embedding"] for row in response.json()["data"]], dtype=np.float32)


def lookups(client: TestClient, kind: str, outcome: str) -> float:
    scrape = client.get("/metrics").text
    return sample_or_zero(scrape, "gateway_cache_lookups_total", kind=kind, outcome=outcome)


@pytest.fixture
def cache_client(settings: ServerSettings, fake: FakeBackend) -> Iterator[TestClient]:
    with TestClient(create_app(cached(settings), lambda *_: fake)) as client:
        yield client


def test_a_repeated_request_is_answered_without_decoding(
    cache_client: TestClient, fake: FakeBackend
) -> None:
    images = [samples.compact(n) for n in range(6)]
    first = embed(cache_client, *images, texts=("a photo of a cat",))
    batches, decodes = fake.batches, _decodes(cache_client)
    second = embed(cache_client, *images, texts=("a photo of a cat",))
    assert np.array_equal(first, second)  # the model's own (unnormalised) rows
    assert fake.batches == batches and len(fake.text_calls) == 1
    assert _decodes(cache_client) == decodes  # nothing decoded the second time
    assert lookups(cache_client, "image", "hit") == 6
    assert lookups(cache_client, "text", "hit") == 1
    # a base64 item is keyed by its text (decoding it on the event loop would cost more than
    # the hash): the same JSON again hits, and the row is the one its upload got
    body = {"input": [{"image": base64.b64encode(images[2]).decode()}], "normalize": False}
    replies = [cache_client.post("/v1/embeddings", json=body) for _ in range(2)]
    rows = [np.array(r.json()["data"][0]["embedding"], np.float32) for r in replies]
    assert np.array_equal(rows[0], first[2]) and np.array_equal(rows[1], first[2])
    assert lookups(cache_client, "image-base64", "hit") == 1


def test_a_changed_image_misses(cache_client: TestClient) -> None:
    embed(cache_client, samples.compact(1))
    embed(cache_client, samples.compact(2))
    assert lookups(cache_client, "image", "hit") == 0
    assert lookups(cache_client, "image", "miss") == 2


def _decodes(client: TestClient) -> float:
    return sample(client.get("/metrics").text, "gateway_images_total", format="jpeg")


@pytest.mark.slow
def test_another_model_never_hits_the_shared_file(settings: ServerSettings, tmp_path: Path) -> None:
    shared = cached(settings, cache_path=tmp_path / "cache.sqlite")
    image = samples.compact(3)
    with TestClient(create_app(shared, lambda *_: FakeBackend(embed_dim=512))) as client:
        first = embed(client, image)
    with TestClient(create_app(shared, lambda *_: FakeBackend(embed_dim=256))) as client:
        other = embed(client, image)
        assert lookups(client, "image", "hit") == 0 and other.shape == (1, 256)
    again = FakeBackend(embed_dim=512)  # the first model, after a restart: the file kept it
    with TestClient(create_app(shared, lambda *_: again)) as client:
        assert np.array_equal(embed(client, image), first)
        assert lookups(client, "image", "hit") == 1 and again.batches == 0
