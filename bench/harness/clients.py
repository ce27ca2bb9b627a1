"""The gateway's load client, a whole request each (multipart JPEGs in hand → embeddings in
hand, binary or JSON), and the SDK's one-off ``post``."""

from __future__ import annotations

import re
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
import orjson

from bench.harness.load import Reply
from clip_gateway.client.core import Retries, multipart, send, send_async

_TIMING = re.compile(r"(\w+);dur=([\d.]+)")


def post(url: str, **request: Any) -> httpx.Response:
    """One POST as the SDK sends it: a 429/502/503/504 or a dropped connection sent again after
    its Retry-After, within the SDK's bounds (clip_gateway/client/core.py ``Retries``). For the
    bench's one-off requests (a parity check, a warm-up); the load generators
    below count refusals instead, as what they measure."""
    return send(lambda: httpx.post(url, **request))


@dataclass
class Batches:
    """Request ``i`` sends batch ``i % len``: each a list of JPEG bytes."""

    batches: list[list[bytes]]
    expected: list[np.ndarray] | None = None  # per batch, to check results by content

    def __call__(self, index: int) -> list[bytes]:
        return self.batches[index % len(self.batches)]


@dataclass
class GatewayClient:
    url: str
    batches: Batches
    binary: bool = True
    #: What a 429/503 gets: counted, as what an overload measures (None), or waited out as its
    #: Retry-After says and sent again, as a study that measures something else needs it.
    retries: Retries | None = None
    http: httpx.AsyncClient = field(init=False)
    bodies: list[tuple[bytes, str]] = field(init=False)

    def __post_init__(self) -> None:
        # as many connections as the gateway accepts (GATEWAY_MAX_CONNECTIONS): an open-loop
        # overload must queue at the server, where admission sees it, not in a client pool
        # (256 connections hid 2x overload from admission: ~11 s of single-image work)
        limits = httpx.Limits(max_connections=2048, max_keepalive_connections=256)
        self.http = httpx.AsyncClient(base_url=self.url, timeout=120, limits=limits)
        self.bodies = [multipart(b, "image/jpeg") for b in self.batches.batches]

    async def __call__(self, index: int) -> Reply:
        slot = index % len(self.bodies)
        body, content_type = self.bodies[slot]
        accept = "application/octet-stream" if self.binary else "application/json"
        headers = {"Content-Type": content_type, "Accept": accept}

        def request() -> Awaitable[httpx.Response]:
            return self.http.post("/v1/embeddings", content=body, headers=headers)

        try:
            response = await (request() if self.retries is None
                              else send_async(request, self.retries))  # fmt: skip
        except httpx.HTTPError:
            return Reply(599, 0, len(body))
        images = len(self.batches.batches[slot])
        if response.status_code != 200:
            return Reply(response.status_code, images, len(body), len(response.content))
        if self.binary:
            rows, dim = map(int, response.headers["x-embedding-shape"].split(","))
            vectors = np.frombuffer(response.content, "<f4").reshape(rows, dim)
        else:
            data = orjson.loads(response.content)["data"]
            vectors = np.array([row["embedding"] for row in data], dtype=np.float32)
        timing = {
            k: float(v) for k, v in _TIMING.findall(response.headers.get("server-timing", ""))
        }
        return Reply(
            200,
            images,
            len(body),
            len(response.content),
            _check(self.batches, slot, vectors),
            timing,
        )

    async def close(self) -> None:
        await self.http.aclose()


def _check(batches: Batches, slot: int, vectors: np.ndarray) -> bool | None:
    if batches.expected is None:
        return None
    expected = batches.expected[slot]
    if vectors.shape != expected.shape:
        return False
    cosine = np.sum(vectors * expected, axis=1) / (
        np.linalg.norm(vectors, axis=1) * np.linalg.norm(expected, axis=1)
    )
    return bool(np.all(cosine > 0.99))
