"""What both clients share: request bodies, response parsing, errors, the retry policy."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

RETRY_STATUSES = frozenset({429, 502, 503, 504})


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
class Settings:
    url: str
    api_key: str | None = None
    #: Images per request (the gateway splits further for Triton).
    batch_size: int = 32
    #: Requests in flight at once.
    concurrency: int = 4
    timeout: float = 120.0
    #: Retries of 429/5xx answers and connection errors, with exponential backoff and jitter.
    retries: int = 6
    backoff: float = 0.5
    max_backoff: float = 20.0
    dtype: str = "float32"
    headers: dict[str, str] = field(default_factory=dict)

    def request_headers(self) -> dict[str, str]:
        headers = {"Accept": "application/octet-stream", **self.headers}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers


def multipart(
    images: Sequence[bytes], content_type: str = "application/octet-stream"
) -> tuple[bytes, str]:
    """One multipart body (httpx's encoder), built once per batch so retries reuse it."""
    files = [("image", (f"{i}.jpg", data, content_type)) for i, data in enumerate(images)]
    request = httpx.Request("POST", "/", files=files)
    return request.read(), request.headers["Content-Type"]


def embed_request(batch: Sequence[bytes], settings: Settings) -> dict[str, Any]:
    """``httpx`` keyword arguments of one ``POST /v1/embeddings`` for ``batch``."""
    body, content_type = multipart(batch)
    return {
        "content": body,
        "headers": {**settings.request_headers(), "Content-Type": content_type},
        "params": {"dtype": settings.dtype},
    }


def outcome(
    response: httpx.Response | None, attempt: int, settings: Settings
) -> np.ndarray | float:
    """After attempt ``attempt`` (``None``: a connection error worth retrying): the embeddings,
    or the seconds to wait before trying again; raises ClientError when no retry is left."""
    if response is not None and response.status_code == 200:
        return parse(response, settings.dtype)
    if not should_retry(response, attempt, settings):
        assert response is not None
        return parse(response, settings.dtype)  # raises ClientError
    retry_after = response.headers.get("retry-after") if response is not None else None
    return delay(attempt, settings, retry_after)


def parse(response: httpx.Response, dtype: str) -> np.ndarray:
    """float32 ``[n, D]`` from a binary answer, or raise ClientError with the problem."""
    if response.status_code != 200:
        raise ClientError(response.status_code, problem(response))
    rows, dim = map(int, response.headers["x-embedding-shape"].split(","))
    raw = np.frombuffer(response.content, "<f2" if dtype == "float16" else "<f4")
    return raw.reshape(rows, dim).astype(np.float32)


def problem(response: httpx.Response) -> dict[str, Any]:
    try:
        body = json.loads(response.content)
    except ValueError:
        body = None
    if isinstance(body, dict):
        return body
    return {"status": response.status_code, "detail": response.text[:500]}


def delay(attempt: int, settings: Settings, retry_after: str | None) -> float:
    """Seconds before retry ``attempt`` (1-based): full-jitter exponential backoff, never
    shorter than the server's Retry-After."""
    ceiling = min(settings.max_backoff, settings.backoff * 2 ** (attempt - 1))
    wait = random.uniform(0, ceiling)  # jitter, not cryptography
    try:
        return max(wait, float(retry_after)) if retry_after else wait
    except ValueError:
        return wait


def should_retry(response: httpx.Response | None, attempt: int, settings: Settings) -> bool:
    if attempt > settings.retries:
        return False
    return response is None or response.status_code in RETRY_STATUSES


def chunks(items: list[bytes], size: int) -> list[list[bytes]]:
    return [items[i : i + size] for i in range(0, len(items), size)]
