"""asyncio client: the same requests on httpx.AsyncClient; compaction runs in worker threads."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from types import TracebackType
from typing import Any

import httpx
import numpy as np

from clip_gateway.client.compact import CompactOptions, ImageLike, compact
from clip_gateway.client.core import (
    ClientError,
    ClientSettings,
    Embedded,
    ItemError,
    Retries,
    T,
    chunks,
    embed_request,
    merge,
    parse,
    parse_json,
    prepare,
    problem,
    send_async,
    skip_invalid_request,
    text_request,
)


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
        self.settings = ClientSettings(
            url, api_key, batch_size, concurrency, timeout, Retries(retries), dtype=dtype
        )
        self.compact = compact if isinstance(compact, CompactOptions) else CompactOptions(compact)
        #: ``compact`` sized for the served model, once asked (``_compact_options``)
        self._sized: CompactOptions | None = None
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        self._http = httpx.AsyncClient(
            base_url=url, timeout=timeout, limits=limits, transport=transport
        )
        self._slots = asyncio.Semaphore(concurrency)
        self._sleep = sleep

    async def embed(self, images: Sequence[ImageLike]) -> np.ndarray:
        """float32 ``[len(images), D]`` in input order (unit length)."""
        options = await self._compact_options()
        payloads = await asyncio.gather(
            *(asyncio.to_thread(compact, image, options) for image in images)
        )
        batches = chunks(list(payloads), self.settings.batch_size)
        results = await asyncio.gather(*(self.embed_bytes(batch) for batch in batches))
        return np.concatenate(results) if results else np.empty((0, 0), np.float32)

    async def embed_valid(self, images: Sequence[ImageLike]) -> Embedded:
        options = await self._compact_options()
        """What can be embedded, and why the rest could not (``Client.embed_valid``)."""
        prepared = await asyncio.gather(
            *(asyncio.to_thread(prepare, i, image, options) for i, image in enumerate(images))
        )
        local = [item for item in prepared if isinstance(item, ItemError)]
        good = [(i, item) for i, item in enumerate(prepared) if isinstance(item, bytes)]
        batches = chunks(good, self.settings.batch_size)
        parts = await asyncio.gather(*(self._embed_valid(batch) for batch in batches))
        return merge([*parts, Embedded(np.empty((0, 0), np.float32), [], local)])

    async def _embed_valid(self, batch: list[tuple[int, bytes]]) -> Embedded:
        input_indices = [i for i, _ in batch]
        request = skip_invalid_request([data for _, data in batch], self.settings)
        try:
            answer = await self._send(request, parse_json)
        except ClientError as exc:
            if exc.status != 413:
                raise
            if len(batch) == 1:
                detail, kind = str(exc.problem.get("detail", "")), exc.problem.get("type")
                error = ItemError(0, "too large", detail, 413, kind)
                return Embedded(np.empty((0, 0), np.float32), [], [error]).at(input_indices)
            half = len(batch) // 2
            halves = await asyncio.gather(
                self._embed_valid(batch[:half]), self._embed_valid(batch[half:])
            )
            return merge(halves)
        return answer.at(input_indices)

    async def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        """float32 ``[len(texts), D]``: the texts in the model's shared image-text space."""
        return (await self._send(text_request(texts, self.settings), parse_json)).vectors

    async def embed_bytes(self, batch: list[bytes]) -> np.ndarray:
        """One request for already-prepared image bytes, retried on 429/5xx."""
        read = partial(parse, dtype=self.settings.dtype)
        return await self._send(embed_request(batch, self.settings), read)

    async def _compact_options(self) -> CompactOptions:
        """``compact`` sized for the served model (its input size and resize mode, from
        ``/v1/models``), asked once; the defaults (224-px models) if the gateway cannot say."""
        if self._sized is None:
            sized = self.compact
            if sized.enabled:
                # if the gateway cannot say, the request itself will report what is wrong
                with contextlib.suppress(
                    ClientError, httpx.HTTPError, LookupError, TypeError, ValueError
                ):
                    sized = sized.for_model(await self.model_info())
            self._sized = sized
        return self._sized

    async def model_info(self) -> dict[str, Any]:
        """The served model (``GET /v1/models``), asked once without retries."""
        headers = {**self.settings.request_headers(), "Accept": "application/json"}
        response = await self._http.get("/v1/models", headers=headers)
        if response.status_code != 200:
            raise ClientError(response.status_code, problem(response))
        models: list[dict[str, Any]] = response.json()["data"]
        return models[0]

    async def _send(self, request: dict[str, Any], read: Callable[[httpx.Response], T]) -> T:
        """``Client._send``; each attempt holds one of the ``concurrency`` slots, the waits
        between them none."""

        async def attempt() -> httpx.Response:
            async with self._slots:
                return await self._http.post("/v1/embeddings", **request)

        response = await send_async(attempt, self.settings.retries, self._sleep)
        if response.status_code != 200:
            raise ClientError(response.status_code, problem(response))
        return read(response)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
