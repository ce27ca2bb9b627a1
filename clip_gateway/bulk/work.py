"""One shard, start to commit: its items read in order, their bytes compacted as the client
SDK does and sent in batches with ``skip_invalid`` through the fleet, their captions
embedded, then every item written once: a row (img_emb, text_emb, metadata) or a failure.

``ShardWorker`` is the job's Ray actor: it keeps one event loop, one fleet and its
connections for every shard it is given. A shard it cannot finish (every gateway
gone, a refusal of the whole job such as a wrong API key) is answered with its error and no
commit, so the next run does it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from clip_gateway.bulk import output, sources
from clip_gateway.bulk.fleet import Fleet, FleetOptions, GatewaysGone, Http
from clip_gateway.client import formats
from clip_gateway.client.compact import CompactOptions
from clip_gateway.client.core import (
    ClientError,
    ClientSettings,
    Embedded,
    ItemError,
    merge,
    parse_json,
    prepare,
    skip_invalid_request,
)

#: The failure type of an input with no image (a caption or JSON whose image is missing).
NO_IMAGE = "no-image"
#: The failure type of a file the client cannot read or convert (HEIC without support...).
UNREADABLE = "unreadable"


@dataclass(frozen=True)
class JobSpec:
    """What every worker needs to know, fixed when the job starts."""

    source: sources.Source
    output: str
    gateways: tuple[str, ...]
    dtype: str = "float16"
    captions: bool = False
    batch_size: int = 32
    fleet: FleetOptions = field(default_factory=FleetOptions)
    compact: bool = True
    api_key: str | None = None
    output_options: dict[str, Any] = field(default_factory=dict)


@dataclass
class ShardResult:
    name: str
    rows: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    bytes_read: int = 0
    seconds: float = 0.0
    error: str | None = None

    def record(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "failures": dict(self.failures),
            "bytes_read": self.bytes_read,
            "seconds": round(self.seconds, 3),
        }


@dataclass
class Slot:
    """One item of the shard while it is worked on: what it will be written as."""

    item: sources.Item
    width: int | None = None
    height: int | None = None
    vector: np.ndarray | None = None
    text: np.ndarray | None = None
    failure: dict[str, Any] | None = None

    def fail(self, kind: str, title: str, detail: str, status: int | None = None) -> None:
        self.failure = {
            "key": self.item.key,
            "image_path": self.item.path,
            "url": self.item.url,
            "type": kind,
            "title": title,
            "detail": detail,
            "status": status,
        }


class ShardEmbedder:
    """Embeds shards through one fleet, on the event loop it is called on."""

    def __init__(
        self,
        spec: JobSpec,
        *,
        http: Callable[[str], Http] | None = None,
        progress: Callable[[int, int, int], None] = lambda rows, failed, read: None,
    ) -> None:
        self.spec = spec
        headers = ClientSettings("", spec.api_key).request_headers()
        self.settings = ClientSettings("", spec.api_key, spec.batch_size)
        self.fleet = Fleet(
            spec.gateways,
            spec.fleet,
            headers=headers,
            http=http,
            on_event=lambda m: print(f"clip-gateway bulk: {m}", file=sys.stderr, flush=True),
        )
        self.progress = progress
        self.output = output.Output.at(spec.output, spec.output_options)
        self._compact: CompactOptions | None = None
        #: Reading and compacting: blocking work, off the event loop.
        self.pool = ThreadPoolExecutor(4, thread_name_prefix="clip-bulk")

    async def compact_options(self) -> CompactOptions:
        """The SDK's compaction sized for the served model (asked once)."""
        if self._compact is None:
            options = CompactOptions(self.spec.compact)
            response = await self.fleet.get("/v1/models") if self.spec.compact else None
            if response is not None and response.status_code == 200:
                with contextlib.suppress(LookupError, TypeError, ValueError):
                    options = options.for_model(response.json()["data"][0])
            self._compact = options
        return self._compact

    async def run(self, shard: sources.Shard) -> ShardResult:
        started = time.monotonic()
        result = ShardResult(shard.name)
        try:
            slots = await self._embed(shard, result)
            await asyncio.get_running_loop().run_in_executor(
                self.pool, self._commit, shard, slots, result
            )
        except (GatewaysGone, ClientError, OSError, sources.SourceError) as exc:
            result.error = f"{type(exc).__name__}: {exc}"
        result.seconds = time.monotonic() - started
        return result

    async def _embed(self, shard: sources.Shard, result: ShardResult) -> list[Slot]:
        loop = asyncio.get_running_loop()
        options = await self.compact_options()
        items = sources.read(self.spec.source, shard)
        slots: list[Slot] = []
        # batches being prepared or sent: enough to keep every gateway's share busy, no more
        window = asyncio.Semaphore(2 * self.spec.fleet.in_flight * len(self.spec.gateways))
        tasks: set[asyncio.Task[None]] = set()
        try:
            while chunk := await loop.run_in_executor(
                self.pool, _take, items, self.spec.batch_size
            ):
                batch = [Slot(item) for item in chunk]
                slots += batch
                result.bytes_read += sum(len(s.item.data or b"") for s in batch)
                await window.acquire()
                task = asyncio.create_task(self._batch(batch, options))
                task.add_done_callback(lambda _: window.release())
                tasks.add(task)
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
        return slots

    async def _batch(self, batch: list[Slot], options: CompactOptions) -> None:
        loop = asyncio.get_running_loop()
        prepared = await loop.run_in_executor(self.pool, _prepare, batch, options)
        sendable = [(i, data) for i, data in enumerate(prepared) if isinstance(data, bytes)]
        answer = await self._images(sendable)
        for row, vector in zip(answer.indices, answer.vectors, strict=True):
            batch[row].vector = vector
        for error in answer.errors:
            batch[error.index].fail(
                error.type or UNREADABLE, error.title, error.detail, error.status
            )
        for slot, data in zip(batch, prepared, strict=True):
            if isinstance(data, ItemError):
                slot.fail(UNREADABLE, data.title, data.detail)
        if self.spec.captions:
            await self._captions([s for s in batch if s.vector is not None])
        done = sum(s.vector is not None for s in batch)
        self.progress(done, len(batch) - done, sum(len(s.item.data or b"") for s in batch))
        # answered: the image's bytes go, so that a worker holds the shard's vectors and
        # metadata until its commit, not every image it read (10,000 photos of 3 MB: 30 GB)
        for slot in batch:
            slot.item = replace(slot.item, data=None)

    async def _images(self, batch: list[tuple[int, bytes]]) -> Embedded:
        """One skip_invalid request for ``batch`` (input index, bytes); one the gateway finds
        too large as a whole is split, as the SDK's ``embed_valid`` does."""
        if not batch:
            return Embedded(np.empty((0, 0), np.float32), [], [])
        indices = [i for i, _ in batch]
        request = skip_invalid_request([data for _, data in batch], self.settings)
        try:
            answer = await self.fleet.post(request, parse_json)
        except ClientError as exc:
            if exc.status != 413:
                raise
            if len(batch) == 1:
                error = ItemError(
                    0, "too large", str(exc.problem.get("detail", "")), 413, exc.problem.get("type")
                )
                return Embedded(np.empty((0, 0), np.float32), [], [error]).at(indices)
            half = len(batch) // 2
            return merge(
                await asyncio.gather(self._images(batch[:half]), self._images(batch[half:]))
            )
        return answer.at(indices)

    async def _captions(self, slots: list[Slot]) -> None:
        captioned = [s for s in slots if s.item.caption]
        if not captioned:
            return
        body = {
            "input": [s.item.caption for s in captioned],
            "modality": "text",
            "encoding_format": "base64",
            "skip_invalid": True,
        }
        headers = {**self.settings.request_headers(), "Accept": "application/json"}
        answer = await self.fleet.post({"json": body, "headers": headers}, parse_json)
        for row, vector in zip(answer.indices, answer.vectors, strict=True):
            captioned[row].text = vector

    def _commit(self, shard: sources.Shard, slots: list[Slot], result: ShardResult) -> None:
        embedded = [s for s in slots if s.vector is not None]
        failed = [s.failure for s in slots if s.failure is not None and s.vector is None]
        result.rows = len(embedded)
        result.failures = Counter(reason_of(f) for f in failed)
        images = texts = None
        if embedded:
            images = np.stack([s.vector for s in embedded if s.vector is not None])
            images = images.astype(self.spec.dtype)
            if self.spec.captions:
                zero = np.zeros(images.shape[1], np.float32)
                texts = np.stack([s.text if s.text is not None else zero for s in embedded])
                texts = texts.astype(self.spec.dtype)
        metadata = [
            {
                "key": s.item.key,
                "image_path": s.item.path,
                "url": s.item.url,
                "caption": s.item.caption,
                "width": s.width,
                "height": s.height,
            }
            for s in embedded
        ]
        output.commit_shard(
            self.output,
            shard.name,
            images=images,
            texts=texts,
            metadata=metadata,
            failures=failed,
            record={**result.record(), "items": len(slots)},
        )

    async def aclose(self) -> None:
        await self.fleet.aclose()
        self.pool.shutdown(wait=False)


def reason_of(failure: dict[str, Any]) -> str:
    kind = str(failure["type"])
    return kind.rstrip("/").rpartition("/")[2]


def _take(items: Iterator[sources.Item], count: int) -> list[sources.Item]:
    return list(itertools.islice(items, count))


def _prepare(batch: list[Slot], options: CompactOptions) -> list[bytes | ItemError | None]:
    """Each slot's bytes to upload (its size read first), the reason it has none, or None for
    an input with no image (failed here)."""
    prepared: list[bytes | ItemError | None] = []
    for index, slot in enumerate(batch):
        data = slot.item.data
        if data is None:
            slot.fail(NO_IMAGE, "No image", "a caption or metadata without its image")
            prepared.append(None)
            continue
        slot.width, slot.height = sources.peek(data)
        if _as_it_is(data, slot.width, slot.height, options):
            prepared.append(data)
        else:
            prepared.append(prepare(index, data, options))
    return prepared


def _as_it_is(data: bytes, width: int | None, height: int | None, options: CompactOptions) -> bool:
    """Whether a JPEG goes as it is, whatever its size in bytes: one whose resized side is
    under twice the model's, so that no DCT scale shrinks its decode (an img2dataset 256-px
    shard's). Compacting it would decode it whole, resize and re-encode it on the worker (2.2 ms
    for a 256-px JPEG of 67 KB here, three times what the gateway spends on a compact one) to
    spare the gateway one resize, and send pixels a JPEG generation further from the original.
    The SDK's compaction stays for larger photos (decoded at a DCT scale) and for conversions."""
    if not options.enabled or width is None or height is None:
        return False
    side = max(width, height) if options.long_side else min(width, height)
    return side < 2 * options.short_side and formats.identify(data[: formats.HEAD_BYTES]) == "jpeg"


class Reports:
    """A worker's counts for the driver's progress bars (the ``Tally`` actor), sent at most
    every ``every_s`` and when a shard ends: the bars redraw twice a second, and a remote call
    per batch is a Ray task submission from the worker for nothing they show."""

    def __init__(self, tally: Any, every_s: float = 1.0) -> None:
        self.tally = tally
        self.every_s = every_s
        self.lock = threading.Lock()
        self.pending = (0, 0, 0)
        self.sent_at = time.monotonic()

    def add(self, rows: int, failed: int, read: int) -> None:
        with self.lock:
            self.pending = (self.pending[0] + rows, self.pending[1] + failed,
                            self.pending[2] + read)  # fmt: skip
            due = time.monotonic() - self.sent_at >= self.every_s
        if due:
            self.flush()

    def flush(self) -> None:
        with self.lock:
            counts, self.pending = self.pending, (0, 0, 0)
            self.sent_at = time.monotonic()
        if any(counts):
            self.tally.add.remote(*counts)


class ShardWorker:
    """The job's Ray actor: a ``ShardEmbedder`` on an event loop of its own thread, kept for the
    worker's life, given one shard per ``run``. ``tally``: the progress bars' actor (None:
    nobody watches them)."""

    def __init__(self, spec: JobSpec, tally: Any = None) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.reports = Reports(tally) if tally is not None else None
        reports = self.reports

        async def make() -> ShardEmbedder:
            if reports is None:
                return ShardEmbedder(spec)
            return ShardEmbedder(spec, progress=reports.add)

        self.embedder = asyncio.run_coroutine_threadsafe(make(), self.loop).result()

    def run(self, shard: sources.Shard) -> ShardResult:
        result = asyncio.run_coroutine_threadsafe(self.embedder.run(shard), self.loop).result()
        if self.reports is not None:
            self.reports.flush()
        return result
