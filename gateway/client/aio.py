"""asyncio client: the same requests on httpx.AsyncClient; compaction runs in worker threads."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType

import httpx
import numpy as np

from gateway.client.compact import CompactOptions, ImageLike, compact
from gateway.client.core import Settings, chunks, embed_request, outcome, should_retry


class AsyncClient:
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
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.settings = Settings(
            url, api_key, batch_size, concurrency, timeout, retries, dtype=dtype
        )
        self.compact = compact if isinstance(compact, CompactOptions) else CompactOptions(compact)
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        self._http = httpx.AsyncClient(
            base_url=url, timeout=timeout, limits=limits, transport=transport
        )
        self._slots = asyncio.Semaphore(concurrency)
        self._sleep = sleep

    async def embed(self, images: Sequence[ImageLike]) -> np.ndarray:
        """float32 ``[len(images), D]`` in input order (unit length)."""
        payloads = await asyncio.gather(
            *(asyncio.to_thread(compact, image, self.compact) for image in images)
        )
        batches = chunks(list(payloads), self.settings.batch_size)
        results = await asyncio.gather(*(self.embed_bytes(batch) for batch in batches))
        return np.concatenate(results) if results else np.empty((0, 0), np.float32)

    async def embed_bytes(self, batch: list[bytes]) -> np.ndarray:
        """One request for already-prepared image bytes, retried on 429/5xx."""
        request = embed_request(batch, self.settings)
        attempt = 0
        while True:
            attempt += 1
            async with self._slots:
                try:
                    response: httpx.Response | None = await self._http.post(
                        "/v1/embeddings", **request
                    )
                except httpx.TransportError:
                    if not should_retry(None, attempt, self.settings):
                        raise
                    response = None
            result = outcome(response, attempt, self.settings)
            if isinstance(result, np.ndarray):
                return result
            await self._sleep(result)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
