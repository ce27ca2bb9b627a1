"""What both clients share: request bodies, response parsing, errors, the retry policy."""

from __future__ import annotations

import asyncio
import base64
import json
import random
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar

import httpx
import numpy as np

from clip_gateway.client.compact import CompactOptions, ImageLike, compact
from clip_gateway.client.formats import UnreadableImage

RETRY_STATUSES = frozenset({429, 502, 503, 504})
T = TypeVar("T")


class ClientError(Exception):
    """The gateway refused a request; ``problem`` is its RFC 9457 document."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        self.status = status
        self.problem = problem
        self.index: int | None = problem.get("index")
        detail = problem.get("detail") or problem.get("title") or ""
        where = f" (image {self.index})" if self.index is not None else ""
        super().__init__(f"{status}: {detail}{where}")


@dataclass(frozen=True)
class ItemError:
    """One input that could not be embedded: refused by the gateway (``status`` set, ``title``
    the problem's title, ``type`` its RFC 9457 type URI) or not readable on the client
    (``status`` and ``type`` are None)."""

    index: int
    title: str
    detail: str
    status: int | None = None
    type: str | None = None

    def __str__(self) -> str:
        text = f"{self.title.lower()}: {self.detail}" if self.detail else self.title.lower()
        return " ".join(text.split())  # one line, whatever the decoder's message held


@dataclass(frozen=True)
class Embedded:
    """``embed_valid``'s answer: a row per input that could be embedded, and the others."""

    vectors: np.ndarray  # float32 [len(indices), D]
    indices: list[int]  # the input position of each row
    errors: list[ItemError]  # by input position

    def at(self, input_indices: Sequence[int]) -> Embedded:
        """The same answer for a request whose item ``i`` was input ``input_indices[i]``."""
        return Embedded(
            self.vectors,
            [input_indices[i] for i in self.indices],
            [replace(e, index=input_indices[e.index]) for e in self.errors],
        )


def merge(parts: Sequence[Embedded]) -> Embedded:
    rows = [part.vectors for part in parts if len(part.indices)]
    return Embedded(
        np.concatenate(rows) if rows else np.empty((0, 0), np.float32),
        [i for part in parts for i in part.indices],
        sorted((e for part in parts for e in part.errors), key=lambda e: e.index),
    )


def prepare(index: int, image: ImageLike, options: CompactOptions) -> bytes | ItemError:
    """The bytes to upload for input ``index``, or why it cannot be read here."""
    try:
        return compact(image, options)
    except OSError as exc:
        return ItemError(index, "cannot read", exc.strerror or str(exc))
    except UnreadableImage as exc:
        return ItemError(index, "unreadable image", str(exc))


@dataclass(frozen=True)
class Retries:
    """When a request is sent again: after a 429, 502, 503 or 504 answer or a dropped
    connection, never sooner than the answer's Retry-After (full-jitter exponential backoff
    where it gives none), at most ``times`` times and ``max_wait_s`` seconds of waiting in all.
    A Retry-After that would pass that bound ends the retries: the caller gets the answer."""

    times: int = 6
    backoff: float = 0.5
    max_backoff: float = 20.0
    max_wait_s: float = 120.0

    def wait(self, response: httpx.Response | None, attempt: int, waited: float) -> float | None:
        """Seconds to wait after attempt ``attempt`` (1-based) ended with ``response`` (None:
        no answer), ``waited`` seconds having been waited already; None: do not send again."""
        if attempt > self.times:
            return None
        if response is not None and response.status_code not in RETRY_STATUSES:
            return None
        ceiling = min(self.max_backoff, self.backoff * 2 ** (attempt - 1))
        wait = random.uniform(0, ceiling)  # jitter, not cryptography
        asked = retry_after(response) if response is not None else None
        if asked is not None:
            wait = max(wait, asked)
        return wait if waited + wait <= self.max_wait_s else None


def retry_after(response: httpx.Response) -> float | None:
    """The seconds a response's ``Retry-After`` asks for (delay-seconds or an HTTP date, RFC
    9110 10.2.3); None when it has none or it cannot be read."""
    value = response.headers.get("retry-after", "").strip()
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def send(
    request: Callable[[], httpx.Response],
    retries: Retries = Retries(),
    sleep: Callable[[float], None] = time.sleep,
) -> httpx.Response:
    """``request()`` again while ``retries`` says so: the answer that ends it (whatever its
    status); a dropped connection on the last attempt is raised."""
    attempt, waited = 0, 0.0
    while True:
        attempt += 1
        try:
            response = request()
        except httpx.TransportError:
            if (wait := retries.wait(None, attempt, waited)) is None:
                raise
        else:
            if (wait := retries.wait(response, attempt, waited)) is None:
                return response
        sleep(wait)
        waited += wait


async def send_async(
    request: Callable[[], Awaitable[httpx.Response]],
    retries: Retries = Retries(),
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> httpx.Response:
    """``send`` for an asyncio caller."""
    attempt, waited = 0, 0.0
    while True:
        attempt += 1
        try:
            response = await request()
        except httpx.TransportError:
            if (wait := retries.wait(None, attempt, waited)) is None:
                raise
        else:
            if (wait := retries.wait(response, attempt, waited)) is None:
                return response
        await sleep(wait)
        waited += wait


@dataclass(frozen=True)
class ClientSettings:
    url: str
    api_key: str | None = None
    #: Images per request (the gateway splits further for Triton).
    batch_size: int = 32
    #: Requests in flight at once.
    concurrency: int = 4
    timeout: float = 120.0
    #: When a 429/5xx answer or a dropped connection is retried (after its Retry-After).
    retries: Retries = Retries()
    dtype: str = "float32"
    headers: dict[str, str] = field(default_factory=dict)

    def request_headers(self) -> dict[str, str]:
        headers = {"Accept": "application/octet-stream", **self.headers}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers


def multipart(
    images: Sequence[bytes],
    content_type: str = "application/octet-stream",
    fields: dict[str, str] | None = None,
) -> tuple[bytes, str]:
    """One multipart/form-data body (RFC 7578) and its Content-Type, built once per batch so
    retries reuse it: ``fields`` first, then each image as an ``image`` part named ``{i}.jpg``.
    Joined here in one pass rather than by httpx's encoder, which spent 120 us per 32-image
    batch against 17 (a part's objects and headers built one by one); the boundary is random,
    as httpx's is."""
    boundary = secrets.token_hex(16)
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
        for name, value in (fields or {}).items()
    ]
    head = f"\r\nContent-Type: {content_type}\r\n\r\n"
    for i, data in enumerate(images):
        parts += (
            f'--{boundary}\r\nContent-Disposition: form-data; name="image"; filename="{i}.jpg"'
            f"{head}".encode(),
            data,
            b"\r\n",
        )
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


def embed_request(batch: Sequence[bytes], settings: ClientSettings) -> dict[str, Any]:
    """``httpx`` keyword arguments of one ``POST /v1/embeddings`` for ``batch``."""
    body, content_type = multipart(batch)
    return {
        "content": body,
        "headers": {**settings.request_headers(), "Content-Type": content_type},
        "params": {"dtype": settings.dtype},
    }


def skip_invalid_request(batch: Sequence[bytes], settings: ClientSettings) -> dict[str, Any]:
    """``embed_request`` with ``skip_invalid``: the answer is JSON, as only JSON carries each
    refused image's reason (base64 rows: a third of the size of float lists)."""
    fields = {"skip_invalid": "true", "encoding_format": "base64"}
    body, content_type = multipart(batch, fields=fields)
    headers = {**settings.request_headers(), "Accept": "application/json"}
    return {"content": body, "headers": {**headers, "Content-Type": content_type}}


def text_request(texts: Sequence[str], settings: ClientSettings) -> dict[str, Any]:
    """``httpx`` keyword arguments of one ``POST /v1/embeddings`` embedding ``texts``."""
    body = {"input": list(texts), "modality": "text", "encoding_format": "base64"}
    headers = {**settings.request_headers(), "Accept": "application/json"}
    return {"json": body, "headers": headers}


def parse(response: httpx.Response, dtype: str) -> np.ndarray:
    """float32 ``[n, D]`` from a binary answer, or raise ClientError with the problem."""
    if response.status_code != 200:
        raise ClientError(response.status_code, problem(response))
    rows, dim = map(int, response.headers["x-embedding-shape"].split(","))
    raw = np.frombuffer(response.content, "<f2" if dtype == "float16" else "<f4")
    return raw.reshape(rows, dim).astype(np.float32)


def parse_json(response: httpx.Response) -> Embedded:
    """An OpenAI-shaped answer (rows as float lists or base64), with ``skip_invalid``'s errors."""
    if response.status_code != 200:
        raise ClientError(response.status_code, problem(response))
    body = response.json()
    rows = sorted(body["data"], key=lambda row: int(row["index"]))
    vectors = _vectors([row["embedding"] for row in rows])
    errors = [
        ItemError(
            int(e["index"]),
            str(e.get("title", "")),
            str(e.get("detail", "")),
            e["status"],
            e.get("type"),
        )
        for e in body.get("errors", [])
    ]
    return Embedded(
        vectors,
        [int(row["index"]) for row in rows],
        sorted(errors, key=lambda e: e.index),
    )


def _vectors(embeddings: list[str | list[float]]) -> np.ndarray:
    """float32 ``[n, D]`` from base64 rows (decoded into one buffer) or float lists."""
    if not embeddings:
        return np.empty((0, 0), np.float32)
    rows = [e for e in embeddings if isinstance(e, str)]
    if len(rows) == len(embeddings):
        raw = b"".join([base64.b64decode(e) for e in rows])
        return np.frombuffer(raw, "<f4").reshape(len(embeddings), -1).astype(np.float32)
    return np.stack([np.asarray(e, dtype=np.float32) for e in embeddings])


def problem(response: httpx.Response) -> dict[str, Any]:
    try:
        body = json.loads(response.content)
    except ValueError:
        body = None
    if isinstance(body, dict):
        return body
    return {"status": response.status_code, "detail": response.text[:500]}


def chunks(items: list[T], size: int) -> list[list[T]]:
    return [items[i : i + size] for i in range(0, len(items), size)]
