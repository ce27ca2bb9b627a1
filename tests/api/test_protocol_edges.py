"""Protocol edges with helpful answers (issue 23): compressed bodies, data URIs in any case,
MIME-wrapped and URL-safe base64, lone surrogates, OpenAI's ``dimensions``, HEAD."""

from __future__ import annotations

import base64
import gzip
import json

import pytest
from litestar.testing import TestClient

from tests import samples
from tests.api.test_bad_input import problem


def embed(client: TestClient, payload: object, **headers: str):
    return client.post(
        "/v1/embeddings",
        content=json.dumps(payload).encode(),
        headers={"content-type": "application/json", **headers},
    )


@pytest.mark.parametrize("coding", ["gzip", "br", "deflate"])
def test_a_compressed_body_is_refused_naming_its_encoding_never_decompressed(
    client: TestClient, coding: str
) -> None:
    body = gzip.compress(b'{"input": ["a cat"]}')
    reply = client.post(
        "/v1/embeddings",
        content=body,
        headers={"content-type": "application/json", "content-encoding": coding},
    )
    detail = problem(reply, 415, "unsupported-media-type")["detail"]
    assert f"Content-Encoding '{coding}' is not accepted" in detail


def test_identity_encoding_is_the_body_as_it_is(client: TestClient) -> None:
    assert (
        embed(client, {"input": ["a cat"]}, **{"content-encoding": "identity"}).status_code == 200
    )


@pytest.mark.parametrize(
    "prefix", ["data:image/jpeg;base64,", "DATA:IMAGE/JPEG;BASE64,", "Data:Image/Jpeg;Base64,"]
)
def test_data_uri_scheme_and_media_type_are_case_insensitive(
    client: TestClient, prefix: str
) -> None:
    uri = prefix + base64.b64encode(samples.compact(0)).decode()
    reply = embed(client, {"input": [uri]})
    assert reply.status_code == 200, reply.text[:300]
    assert reply.json()["usage"]["images"] == 1  # an image, not a text


@pytest.mark.slow
def test_mime_wrapped_base64_is_accepted(client: TestClient) -> None:
    encoded = base64.encodebytes(samples.compact(0)).decode()  # 76-character lines
    assert "\n" in encoded
    reply = embed(client, {"input": [{"image": encoded}]})
    assert reply.status_code == 200, reply.text[:300]


def test_url_safe_base64_is_refused_saying_what_to_send(client: TestClient) -> None:
    data = samples.compact(0)
    encoded = base64.urlsafe_b64encode(data).decode()
    assert "-" in encoded or "_" in encoded
    body = problem(embed(client, {"input": [{"image": encoded}]}), 422, "invalid-image", 0)
    assert "URL-safe alphabet" in body["detail"]
    assert "send standard base64 (RFC 4648 section 4" in body["detail"]


@pytest.mark.parametrize(
    ("raw", "index"),
    [
        (b'{"input": ["fine", "a\\ud800"]}', 1),  # a high surrogate at a string's end
        (b'{"input": "\\udc00 alone"}', 0),  # a low surrogate without its high one
        (b'{"input": ["ok", {"text": "x\\ud83dy"}]}', 1),
    ],
)
def test_a_lone_surrogate_is_a_400_naming_the_item(
    client: TestClient, raw: bytes, index: int
) -> None:
    reply = client.post("/v1/embeddings", content=raw, headers={"content-type": "application/json"})
    body = problem(reply, 400, "invalid-request", index)
    assert "lone UTF-16 surrogate" in body["detail"]


def test_a_surrogate_pair_is_a_character(client: TestClient) -> None:
    reply = client.post(
        "/v1/embeddings",
        content=b'{"input": ["\\ud83d\\ude00"]}',
        headers={"content-type": "application/json"},
    )
    assert reply.status_code == 200, reply.text[:300]


@pytest.mark.parametrize("dimensions", [64, 0, -1])
def test_dimensions_other_than_the_models_are_refused_naming_parameter_and_model(
    client: TestClient, dimensions: int
) -> None:
    reply = embed(client, {"input": ["a cat"], "dimensions": dimensions})
    detail = problem(reply, 400, "invalid-request")["detail"]
    assert detail.startswith(f"dimensions={dimensions} is not supported by model ")
    card = client.get("/v1/models").json()["data"][0]
    assert card["dimensions"] == [card["embed_dim"]]
    assert f"{card['id']!r}" in detail


def test_the_models_own_dimensions_are_accepted(client: TestClient) -> None:
    dim = client.get("/v1/models").json()["data"][0]["embed_dim"]
    reply = embed(client, {"input": ["a cat"], "dimensions": dim, "unknown_field": 1})
    assert reply.status_code == 200, reply.text[:300]
    assert len(reply.json()["data"][0]["embedding"]) == dim


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/v1/models", "/metrics"])
def test_head_is_answered_on_every_get_route(client: TestClient, path: str) -> None:
    got = client.get(path)
    head = client.head(path)
    assert head.status_code == got.status_code == 200
    assert head.content == b""
    assert head.headers["content-type"] == got.headers["content-type"]


def test_head_on_a_post_route_is_still_not_allowed(client: TestClient) -> None:
    assert client.head("/v1/embeddings").status_code == 405
