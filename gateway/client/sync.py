"""Blocking client: threads compact the photos and carry the requests (bounded concurrency)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType

import httpx
import numpy as np

from gateway.client.compact import CompactOptions, ImageLike, compact
from gateway.client.core import Settings, chunks, embed_request, outcome, should_retry


class Client:
    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        batch_size: int = 32,
        concurrency: int = 4,
        timeout: float = 120.0,
        retries: int = 6,
        compact: CompactOptions | bool = True,
        dtype: str = "float32",
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.settings = Settings(
            url, api_key, batch_size, concurrency, timeout, retries, dtype=dtype
        )
        self.compact = compact if isinstance(compact, CompactOptions) else CompactOptions(compact)
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        self._http = httpx.Client(base_url=url, timeout=timeout, limits=limits, transport=transport)
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="clip-client")
        self._sleep = sleep

    def embed(self, images: Sequence[ImageLike]) -> np.ndarray:
        """float32 ``[len(images), D]`` in input order (unit length)."""
        payloads = list(self._pool.map(lambda image: compact(image, self.compact), images))
        results = list(self._pool.map(self.embed_bytes, chunks(payloads, self.settings.batch_size)))
        return np.concatenate(results) if results else np.empty((0, 0), np.float32)

    def embed_bytes(self, batch: list[bytes]) -> np.ndarray:
        """One request for already-prepared image bytes, retried on 429/5xx."""
        request = embed_request(batch, self.settings)
        attempt = 0
        while True:
            attempt += 1
            try:
                response: httpx.Response | None = self._http.post("/v1/embeddings", **request)
            except httpx.TransportError:
                if not should_retry(None, attempt, self.settings):
                    raise
                response = None
            result = outcome(response, attempt, self.settings)
            if isinstance(result, np.ndarray):
                return result
            self._sleep(result)

    def close(self) -> None:
        self._pool.shutdown()
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
