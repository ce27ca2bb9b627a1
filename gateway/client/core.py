"""What both clients share: request bodies, response parsing, errors, the retry policy."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
import orjson

BOUNDARY = "clip-gateway-client"
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


def multipart(images: list[bytes]) -> tuple[bytes, str]:
    parts = [
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="image"; filename="{i}"\r\n'
        f"Content-Type: application/octet-stream\r\n\r\n".encode()
        + data
        + b"\r\n"
        for i, data in enumerate(images)
    ]
    return b"".join(
        parts
    ) + f"--{BOUNDARY}--\r\n".encode(), f"multipart/form-data; boundary={BOUNDARY}"


def parse(response: httpx.Response, dtype: str) -> np.ndarray:
    """float32 ``[n, D]`` from a binary answer, or raise ClientError with the problem."""
    if response.status_code != 200:
        raise ClientError(response.status_code, problem(response))
    rows, dim = map(int, response.headers["x-embedding-shape"].split(","))
    raw = np.frombuffer(response.content, "<f2" if dtype == "float16" else "<f4")
    return raw.reshape(rows, dim).astype(np.float32)


def problem(response: httpx.Response) -> dict[str, Any]:
    try:
        body = orjson.loads(response.content)
    except orjson.JSONDecodeError:
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
