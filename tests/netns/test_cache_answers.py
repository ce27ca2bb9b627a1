"""A cache hit answers exactly what the miss answered (issue 42), on every route and in every
form, against a real gateway process with the cache on: each request is sent twice, the
second answered from the cache (its lookups counted as hits), and the two answers compared
field by field: status, headers (but the date and the timings), and the body, parsed.

Before the fix the second identical ``/predict`` image was a 500 (a hit is not decoded, and the
size Immich's answer carries came from the decode), and a text answered from the cache reported
``prompt_tokens`` 0."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from clip_gateway.config.processes import GatewayProcess
from tests import samples
from tests.metrics import sample_or_zero
from tests.netns.images import Images, gateway, serving

NAME = "ViT-B-32__openai"
#: What may differ between two answers: when they were made, and how long their parts took.
TIMING = {"date", "server-timing"}


@pytest.fixture(scope="module")
def server() -> Iterator[Images]:
    with serving() as images:
        yield images


@pytest.fixture(scope="module")
def process(
    tmp_path_factory: pytest.TempPathFactory, clip_tokenizer_file: Path
) -> Iterator[GatewayProcess]:
    env = {"GATEWAY_CACHE_MIB": "8", "GATEWAY_IMMICH": "true", "GATEWAY_IMMICH_ALIASES": NAME}
    with gateway(tmp_path_factory.mktemp("cache"), str(clip_tokenizer_file), **env) as running:
        yield running


def data_uri(image: bytes) -> str:
    return "data:image/jpeg;base64," + base64.b64encode(image).decode()


def embeddings(
    body: object, binary: bool = False, **params: str
) -> Callable[[GatewayProcess, Images], Any]:
    def send(process: GatewayProcess, server: Images) -> httpx.Response:
        text = json.dumps(body).replace("{S}", server.url)
        headers = {"content-type": "application/json"}
        if binary:
            headers["accept"] = "application/octet-stream"
        return httpx.post(f"{process.url}/v1/embeddings", content=text, headers=headers,
                          params=params, timeout=30)  # fmt: skip

    return send


def multipart(images: list[bytes], texts: list[str]) -> Callable[[GatewayProcess, Images], Any]:
    def send(process: GatewayProcess, server: Images) -> httpx.Response:
        files: list[tuple[str, Any]] = [
            ("image", (f"{i}.jpg", image, "image/jpeg")) for i, image in enumerate(images)
        ]
        files += [("text", (None, text)) for text in texts]
        return httpx.post(f"{process.url}/v1/embeddings", files=files, timeout=30)

    return send


def predict(kind: str, value: bytes | str) -> Callable[[GatewayProcess, Images], Any]:
    def send(process: GatewayProcess, server: Images) -> httpx.Response:
        entries = json.dumps({"clip": {kind: {"modelName": NAME}}})
        files: list[tuple[str, Any]] = [("entries", (None, entries))]
        if isinstance(value, bytes):
            files.append(("image", ("blob", value, "application/octet-stream")))
        else:
            files.append(("text", (None, value)))
        return httpx.post(f"{process.url}/predict", files=files, timeout=30)

    return send


#: Each case's images are its own (no case hits another's entries): (name, request, hits).
CASES = [
    (
        "json float",
        embeddings({"input": [{"image": data_uri(samples.compact(20))}, "a cat on a mat"]}),
        2,
    ),
    (
        "json base64, raw",
        embeddings(
            {
                "input": [{"image": data_uri(samples.compact(21))}, "a dog in the snow"],
                "encoding_format": "base64",
                "normalize": False,
            }
        ),
        2,
    ),
    (
        "json url + text, skip_invalid",
        embeddings(
            {
                "input": [
                    {"image": "{S}/img/22"},
                    "a red bicycle",
                    {"image": "not base64 !"},
                    {"image": "{S}/404"},
                ],
                "skip_invalid": True,
            }
        ),
        2,
    ),
    (
        "openai image_url",
        embeddings(
            {
                "input": [
                    {"type": "image_url", "image_url": {"url": "{S}/img/23"}},
                    {"type": "text", "text": "two birds"},
                ]
            }
        ),
        2,
    ),
    (
        "binary float32",
        embeddings({"input": [{"image": data_uri(samples.compact(24))}, "a boat"]}, binary=True),
        2,
    ),
    (
        "binary float16, skip_invalid",
        embeddings(
            {"input": [{"image": data_uri(samples.compact(25))}, "", "a lamp"]},
            binary=True,
            dtype="float16",
            skip_invalid="true",
        ),
        2,
    ),
    (
        "multipart",
        multipart([samples.compact(26), samples.oriented_jpeg(6, seed=3)], ["a tree", "a house"]),
        4,
    ),
    ("immich visual", predict("visual", samples.oriented_jpeg(6, seed=4)), 1),
    ("immich visual, square", predict("visual", samples.compact(27)), 1),
    ("immich textual", predict("textual", "a photo of a beach"), 1),
]


def hits(process: GatewayProcess) -> float:
    scrape = httpx.get(f"{process.url}/metrics", timeout=10).text
    return sum(
        sample_or_zero(scrape, "gateway_cache_lookups_total", kind=kind, outcome="hit")
        for kind in ("image", "image-base64", "text")
    )


def answer(response: httpx.Response) -> dict[str, Any]:
    kind = response.headers.get("content-type", "")
    body: object = response.json() if "json" in kind else response.content
    headers = {k: v for k, v in response.headers.items() if k not in TIMING}
    return {"status": response.status_code, "headers": headers, "body": body}


@pytest.mark.parametrize(("name", "send", "count"), CASES, ids=[c[0] for c in CASES])
def test_a_hit_answers_what_the_miss_answered(
    process: GatewayProcess, server: Images, name: str, send: Any, count: int
) -> None:
    before = hits(process)
    miss = answer(send(process, server))
    assert miss["status"] == 200, miss["body"]
    missed = hits(process)
    hit = answer(send(process, server))
    assert hits(process) - missed == count and missed == before  # the second one hit, only it
    for field in ("status", "headers", "body"):
        assert hit[field] == miss[field], field
