"""asyncio client: the same requests on httpx.AsyncClient; compaction runs in worker threads."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType

import httpx
import numpy as np

from gateway.client.compact import CompactOptions, ImageLike, compact
from gateway.client.core import Settings, chunks, delay, multipart, parse, should_retry


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
        body, content_type = multipart(batch)
        headers = {**self.settings.request_headers(), "Content-Type": content_type}
        attempt = 0
        while True:
            attempt += 1
            async with self._slots:
                try:
                    response: httpx.Response | None = await self._http.post(
                        "/v1/embeddings",
                        content=body,
                        headers=headers,
                        params={"dtype": self.settings.dtype},
                    )
                except httpx.TransportError:
                    if not should_retry(None, attempt, self.settings):
                        raise
                    response = None
            if response is not None and response.status_code == 200:
                return parse(response, self.settings.dtype)
            if not should_retry(response, attempt, self.settings):
                assert response is not None
                return parse(response, self.settings.dtype)  # raises ClientError
            retry_after = response.headers.get("retry-after") if response is not None else None
            await self._sleep(delay(attempt, self.settings, retry_after))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
