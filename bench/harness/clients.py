"""One client per system, each doing a whole request: JPEG bytes in hand → embeddings in hand.

- C  ``gateway``       multipart compact JPEGs → our gateway (binary response; ``gateway-json``)
- A  ``pytorch``       base64 JPEGs in JSON → the PyTorch FastAPI baseline (bench/baselines)
- B  ``triton-grpc``   client-side PIL decode + open_clip transforms → FP32 NCHW → Triton gRPC
- B  ``triton-http``   the same over Triton's HTTP API with binary tensors
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
import orjson

from bench.harness.load import Reply
from clip_gateway.client.core import Retries, multipart, send, send_async

SYSTEMS = ("gateway", "gateway-json", "pytorch", "triton-grpc", "triton-http")
_TIMING = re.compile(r"(\w+);dur=([\d.]+)")


def post(url: str, **request: Any) -> httpx.Response:
    """One POST as the SDK sends it: a 429/502/503/504 or a dropped connection sent again after
    its Retry-After, within the SDK's bounds (clip_gateway/client/core.py ``Retries``). For the
    bench's one-off requests (a parity check, a warm-up, a fidelity sample); the load generators
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


@dataclass
class PytorchClient:
    """Baseline A's wire format: base64 JPEGs in a JSON body, JSON floats back."""

    url: str
    batches: Batches
    http: httpx.AsyncClient = field(init=False)
    bodies: list[bytes] = field(init=False)

    def __post_init__(self) -> None:
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
        self.http = httpx.AsyncClient(base_url=self.url, timeout=300, limits=limits)
        self.bodies = [
            orjson.dumps({"images": [base64.b64encode(x).decode() for x in batch]})
            for batch in self.batches.batches
        ]

    async def __call__(self, index: int) -> Reply:
        slot = index % len(self.bodies)
        body = self.bodies[slot]
        try:
            response = await self.http.post(
                "/embed", content=body, headers={"Content-Type": "application/json"}
            )
        except httpx.HTTPError:
            return Reply(599, 0, len(body))
        images = len(self.batches.batches[slot])
        if response.status_code != 200:
            return Reply(response.status_code, images, len(body))
        vectors = np.array(orjson.loads(response.content)["embeddings"], dtype=np.float32)
        return Reply(
            200, images, len(body), len(response.content), _check(self.batches, slot, vectors)
        )

    async def close(self) -> None:
        await self.http.aclose()


class ClientPreprocessing:
    """What baseline B's client does before it can call Triton: PIL full decode + open_clip's
    transforms to a normalised FP32 NCHW batch (in a thread, so the event loop keeps going)."""

    def __init__(self) -> None:
        import open_clip
        import torch

        torch.set_num_threads(1)
        _, _, self.transform = open_clip.create_model_and_transforms("ViT-B-32", pretrained=None)

    def __call__(self, images: Sequence[bytes]) -> np.ndarray:
        import torch
        from PIL import Image

        tensors = [self.transform(Image.open(io.BytesIO(x)).convert("RGB")) for x in images]
        return torch.stack(tensors).numpy()


@dataclass
class TritonRawClient:
    """Baseline B: the client sends FP32 NCHW tensors straight to Triton's ``clip_raw``."""

    url: str
    batches: Batches
    protocol: str = "grpc"
    preprocess: Callable[[Sequence[bytes]], np.ndarray] = field(default_factory=ClientPreprocessing)
    client: Any = field(init=False)

    def __post_init__(self) -> None:
        if self.protocol == "grpc":
            import tritonclient.grpc.aio as grpcclient

            self.module = grpcclient
            self.client = grpcclient.InferenceServerClient(
                self.url,
                channel_args=[
                    ("grpc.max_send_message_length", 512 << 20),
                    ("grpc.max_receive_message_length", 512 << 20),
                ],
            )
        else:
            import tritonclient.http.aio as httpclient

            self.module = httpclient
            self.client = httpclient.InferenceServerClient(self.url, conn_limit=256)

    async def __call__(self, index: int) -> Reply:
        from tritonclient.utils import InferenceServerException

        slot = index % len(self.batches.batches)
        images = self.batches.batches[slot]
        tensor = await asyncio.to_thread(self.preprocess, images)
        infer_input = self.module.InferInput("input", list(tensor.shape), "FP32")
        if self.protocol == "grpc":
            infer_input.set_data_from_numpy(tensor)
            outputs = [self.module.InferRequestedOutput("embedding")]
        else:
            infer_input.set_data_from_numpy(tensor, binary_data=True)
            outputs = [self.module.InferRequestedOutput("embedding", binary_data=True)]
        try:
            result = await self.client.infer("clip_raw", [infer_input], outputs=outputs)
        except InferenceServerException:
            return Reply(503, len(images), tensor.nbytes)
        vectors = result.as_numpy("embedding")
        vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        return Reply(
            200, len(images), tensor.nbytes, vectors.nbytes, _check(self.batches, slot, vectors)
        )

    async def close(self) -> None:
        await self.client.close()


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


def tensor_json_bytes(images: int = 1, size: int = 224) -> int:
    """Bytes of Triton's JSON request for one FP32 image (the reports' ``.tolist()`` variant)."""
    tensor = np.random.default_rng(0).standard_normal((images, 3, size, size)).astype(np.float32)
    body = {
        "inputs": [
            {
                "name": "input",
                "shape": list(tensor.shape),
                "datatype": "FP32",
                "data": tensor.tolist(),
            }
        ]
    }
    return len(json.dumps(body).encode()) // images
