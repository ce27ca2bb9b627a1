"""The OpenAPI document is generated from the request/response types and the error map, is a
valid OpenAPI document, and /docs links only to assets this server serves (a real browser renders
it offline in tests/integration/test_docs_page.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from litestar.testing import TestClient
from openapi_spec_validator import validate

from clip_gateway.http.problems import PROBLEMS
from clip_gateway.http.schemas import EmbeddingRequest, EmbeddingResponse, ModelList, Problem
from tests import samples

ROOT = Path(__file__).resolve().parents[2]


def test_the_document_is_valid_openapi(client: TestClient) -> None:
    validate(client.get("/docs/openapi.json").json())


def test_the_embeddings_operation_comes_from_the_types_and_the_error_map(
    client: TestClient,
) -> None:
    operation = client.get("/docs/openapi.json").json()["paths"]["/v1/embeddings"]["post"]
    body = operation["requestBody"]["content"]["application/json"]["schema"]
    assert set(body["properties"]) == set(EmbeddingRequest.__struct_fields__)
    assert body["required"] == ["input"]
    form = operation["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert {"image", "text", "model", "normalize", "skip_invalid", "encoding_format"} == set(
        form["properties"]
    )
    ok = operation["responses"]["200"]
    assert set(ok["content"]["application/json"]["schema"]["properties"]) == set(
        EmbeddingResponse.__struct_fields__
    )
    assert {"X-Embedding-Shape", "X-Embedding-Indices", "X-Embedding-Failed"} <= set(ok["headers"])
    documented = {int(status) for status in operation["responses"]} - {200}
    mapped = {p.status for p in PROBLEMS.values() if p.status != 500}
    assert documented == mapped - {499}  # nobody reads a 499: the client has gone
    for status in (429, 503):
        assert "Retry-After" in operation["responses"][str(status)]["headers"]


def test_answers_decode_as_their_documented_types(client: TestClient) -> None:
    image = [("image", ("a.jpg", samples.compact(0), "image/jpeg"))]
    msgspec.json.decode(client.post("/v1/embeddings", files=image).content, type=EmbeddingResponse)
    skipped = client.post(
        "/v1/embeddings?skip_invalid=true", files=[*image, ("image", ("b", b"x", "image/jpeg"))]
    )
    assert msgspec.json.decode(skipped.content, type=EmbeddingResponse).errors[0].index == 1
    problem = client.post("/v1/embeddings", files=[("image", ("b", b"x", "image/jpeg"))])
    assert msgspec.json.decode(problem.content, type=Problem).index == 0
    msgspec.json.decode(client.get("/v1/models").content, type=ModelList)


def test_docs_need_no_internet(client: TestClient) -> None:
    page = client.get("/docs")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    urls = re.findall(r"""(?:src|href)=["']([^"']+)["']""", page.text)
    assert urls and all(url.startswith("/docs/assets/") for url in urls), urls
    for url in urls:
        asset = client.get(url)
        assert asset.status_code == 200 and len(asset.content) > 100, url


@pytest.mark.slow
def test_serving_the_docs_assets_never_imports_flask() -> None:
    # flask-swagger-ui ships Swagger UI's files; its module imports Flask, never run here
    code = "import sys, clip_gateway.http.docs as d; d.assets(); print('flask' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"
