"""Blocking client: threads compact the photos and carry the requests (bounded concurrency)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
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
    send,
    skip_invalid_request,
    text_request,
)


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
        self.settings = ClientSettings(
            url, api_key, batch_size, concurrency, timeout, Retries(retries), dtype=dtype
        )
        self.compact = compact if isinstance(compact, CompactOptions) else CompactOptions(compact)
        #: ``compact`` sized for the served model, once asked (``_compact_options``)
        self._sized: CompactOptions | None = None
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        self._http = httpx.Client(base_url=url, timeout=timeout, limits=limits, transport=transport)
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="clip-client")
        self._sleep = sleep

    def embed(self, images: Sequence[ImageLike]) -> np.ndarray:
        """float32 ``[len(images), D]`` in input order (unit length)."""
        options = self._compact_options()
        payloads = list(self._pool.map(lambda image: compact(image, options), images))
        results = list(self._pool.map(self.embed_bytes, chunks(payloads, self.settings.batch_size)))
        return np.concatenate(results) if results else np.empty((0, 0), np.float32)

    def embed_valid(self, images: Sequence[ImageLike]) -> Embedded:
        """Embed what can be embedded and say why the rest could not, never failing for one
        input: the gateway's ``skip_invalid`` for bad images, the client's own reason for
        files it cannot read. Raises only for the request as a whole (unreachable, refused)."""
        prepared = list(
            self._pool.map(
                partial(prepare, options=self._compact_options()), range(len(images)), images
            )
        )
        local = [item for item in prepared if isinstance(item, ItemError)]
        good = [(i, item) for i, item in enumerate(prepared) if isinstance(item, bytes)]
        parts = list(self._pool.map(self._embed_valid, chunks(good, self.settings.batch_size)))
        return merge([*parts, Embedded(np.empty((0, 0), np.float32), [], local)])

    def _embed_valid(self, batch: list[tuple[int, bytes]]) -> Embedded:
        """One skip_invalid request; one the gateway finds too large as a whole is split."""
        input_indices = [i for i, _ in batch]
        request = skip_invalid_request([data for _, data in batch], self.settings)
        try:
            answer = self._send(request, parse_json)
        except ClientError as exc:
            if exc.status != 413:
                raise
            if len(batch) == 1:
                detail, kind = str(exc.problem.get("detail", "")), exc.problem.get("type")
                error = ItemError(0, "too large", detail, 413, kind)
                return Embedded(np.empty((0, 0), np.float32), [], [error]).at(input_indices)
            half = len(batch) // 2
            return merge([self._embed_valid(batch[:half]), self._embed_valid(batch[half:])])
        return answer.at(input_indices)

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        """float32 ``[len(texts), D]``: the texts in the model's shared image-text space."""
        return self._send(text_request(texts, self.settings), parse_json).vectors

    def embed_bytes(self, batch: list[bytes]) -> np.ndarray:
        """One request for already-prepared image bytes, retried on 429/5xx."""
        read = partial(parse, dtype=self.settings.dtype)
        return self._send(embed_request(batch, self.settings), read)

    def _compact_options(self) -> CompactOptions:
        """``compact`` sized for the served model (its input size and resize mode, from
        ``/v1/models``), asked once; the defaults (224-px models) if the gateway cannot say."""
        if self._sized is None:
            sized = self.compact
            if sized.enabled:
                # if the gateway cannot say, the request itself will report what is wrong
                with contextlib.suppress(
                    ClientError, httpx.HTTPError, LookupError, TypeError, ValueError
                ):
                    sized = sized.for_model(self.model_info())
            self._sized = sized
        return self._sized

    def model_info(self) -> dict[str, Any]:
        """The served model (``GET /v1/models``), asked once without retries: a quick check
        that the gateway answers and accepts the API key."""
        headers = {**self.settings.request_headers(), "Accept": "application/json"}
        response = self._http.get("/v1/models", headers=headers)
        if response.status_code != 200:
            raise ClientError(response.status_code, problem(response))
        models: list[dict[str, Any]] = response.json()["data"]
        return models[0]

    def _send(self, request: dict[str, Any], read: Callable[[httpx.Response], T]) -> T:
        """One POST, sent again on 429/5xx and dropped connections (``Retries``): what ``read``
        finds in the answer, or ClientError with its problem."""
        response = send(
            lambda: self._http.post("/v1/embeddings", **request), self.settings.retries, self._sleep
        )
        if response.status_code != 200:
            raise ClientError(response.status_code, problem(response))
        return read(response)

    def close(self, *, wait: bool = True) -> None:
        """Release the threads and connections; ``wait=False`` (an interrupted caller) does not
        wait for requests still in flight, and cancels those not started."""
        self._pool.shutdown(wait=wait, cancel_futures=not wait)
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close(wait=kind is None or not issubclass(kind, KeyboardInterrupt))
