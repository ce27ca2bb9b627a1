"""The pipeline as a library: items in, embeddings out. Knows nothing of HTTP.

Its API: ``EmbeddingService(backend, pool, PipelineOptions, ...)`` (its own options, built at
the edge from the settings), ``admit()`` for a ``Reservation``, ``embed(reservation, items)``
which takes one (a call cannot skip admission), and ``capabilities()``: what the served model
can embed, for the routes to describe.

A request may mix images and texts: they go their own ways at once (images decoded in the thread
pool, pipeline/batching.py, straight into an image batch the backend lends; texts checked and
tokenised, pipeline/texts.py) to their own models, and the rows come back in request order, in
one space. Admission (pipeline/admission.py) is decided while the request is read, item by item
on the reservation; the service feeds it the decode and backend timings it learns the costs
from. Batches larger than a model's max are split and sent concurrently, and Triton's dynamic
batcher merges calls from concurrent requests. The whole request runs under one deadline, which
also bounds each gRPC call.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Protocol, Self, TypeVar

import numpy as np
from opentelemetry.trace import NoOpTracer, Tracer

from clip_gateway.backend.protocol import (
    ImageBatch,
    InferenceBackend,
    ModelInfo,
    ModelPreprocessing,
    TextModel,
)
from clip_gateway.config import memory
from clip_gateway.errors import (
    BackendFailed,
    BackendTimeout,
    BackendUnavailable,
    DeadlineExceeded,
    EmbeddingError,
    ModalityUnavailable,
)
from clip_gateway.imaging.preprocess import Decoded, DecodeOptions, Variant
from clip_gateway.observability.metrics import Metrics
from clip_gateway.pipeline import cache as _cache
from clip_gateway.pipeline.admission import METER_FLOOR_S, Admission, Reservation
from clip_gateway.pipeline.batching import BatchDecoder, DecodeSample, Meter
from clip_gateway.pipeline.canary import Canary
from clip_gateway.pipeline.items import ImageItem, Item, TextItem
from clip_gateway.pipeline.texts import BatchTokenizer


@dataclass(frozen=True)
class PipelineOptions:
    """What the pipeline is told: its limits, deadline and admission figures, built at the edge
    from the process's settings (http/app.py), never those settings themselves."""

    #: The whole request's deadline, which bounds each backend call too.
    request_timeout_s: float
    #: Decode threads in the pool: admission spreads decode work over them.
    decode_threads: int
    #: Admitted work at once, in seconds (pipeline/admission.py).
    horizon_s: float
    #: Largest image batch per backend call; 0: the model's own max.
    max_batch_size: int = 0
    max_image_pixels: int = 100_000_000
    max_image_bytes: int = 32 << 20
    max_decode_bytes: int = 256 << 20
    progressive_dc_only: bool = True
    max_text_chars: int = 4096
    #: Backend seconds per image, pinned; 0: learned from the backend calls.
    infer_s_per_image: float = 0.0
    max_body_bytes_in_flight: int = 256 << 20
    body_timeout_s: float = 30.0
    #: One API key's share of the horizon.
    key_share: float = 1.0
    #: A request whose decodes spend more than this multiple of their price is stopped.
    decode_overspend: float = 3.0
    #: This machine's decode speed per coding, as multiples of imaging/work.py's factors
    #: (pipeline/decode_speed.py); a coding not named: the factors as they are.
    decode_speed: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Capabilities:
    """The served model as the backend describes it, and what this gateway can embed with it,
    as the routes describe them (/v1/models)."""

    model: ModelInfo
    #: Why texts cannot be embedded here (no text model, or its tokenizer does not load here);
    #: None: they can.
    text_unavailable: str | None

    @property
    def text(self) -> TextModel | None:
        """The text model, when texts can be embedded here."""
        return self.model.text if self.text_unavailable is None else None

    @property
    def modalities(self) -> tuple[str, ...]:
        return ("image", "text") if self.text is not None else ("image",)


@dataclass(frozen=True)
class Embeddings:
    vectors: np.ndarray  # float32 [n_ok, D], in request order
    indices: tuple[int, ...]  # request index of each row
    errors: tuple[EmbeddingError, ...]  # skipped items (skip_invalid), each with its index
    model: ModelInfo
    #: What each decoded image was (format, size), in request order.
    image_facts: tuple[Decoded, ...]
    decode_seconds: float
    infer_seconds: float
    images: int = 0
    texts: int = 0
    #: Text tokens the model read (start and end tokens included, padding not).
    tokens: int = 0
    tokenize_seconds: float = 0.0
    #: Each image row's (width, height) as decoded, the cache's rows' as they were, by the
    #: item's request index.
    image_sizes: dict[int, tuple[int, int]] = field(default_factory=dict)


@dataclass
class _PartialEmbeddings:
    """The embeddings of one share of a request's items: its images, its texts, or those the
    cache answered; the service puts the shares back in request order."""

    kind: str  # "image", "text" or "cached"
    vectors: np.ndarray
    indices: tuple[int, ...]
    errors: tuple[EmbeddingError, ...] = ()
    image_facts: tuple[Decoded, ...] = ()
    prepare_seconds: float = 0.0  # decode or tokenise
    infer_seconds: float = 0.0
    #: The tokens of each text row (texts; the cache's text rows), and each image row's size.
    counts: dict[int, int] = field(default_factory=dict)
    sizes: dict[int, tuple[int, int]] = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        return sum(self.counts.values())


class EmbeddingService:
    def __init__(
        self,
        backend: InferenceBackend,
        pool: Executor,
        options: PipelineOptions,
        *,
        tracer: Tracer | None = None,
        metrics: Metrics | None = None,
        cache: _cache.EmbeddingCache | None = None,
    ) -> None:
        self._backend = backend
        #: Content-addressed embeddings (pipeline/cache.py), consulted as items are admitted.
        self._cache = cache
        #: The served model, once the backend has said (the cache's identity is made from it).
        self._model: ModelInfo | None = None
        self._options = options
        self._metrics = metrics or Metrics()
        self.admission = Admission(
            options.horizon_s,
            options.decode_threads,
            self._metrics,
            infer_s_per_image=options.infer_s_per_image,
            max_body_bytes_in_flight=options.max_body_bytes_in_flight,
            body_timeout_s=options.body_timeout_s,
            key_share=options.key_share,
            overspend=options.decode_overspend,
            decode_speed=options.decode_speed,
        )
        self._trimmer = memory.Trimmer(pool.submit)
        self._decoder = BatchDecoder(pool, tracer or NoOpTracer(), self._metrics, self._decoded)
        self._tokenizer = BatchTokenizer(pool, options.max_text_chars, self._metrics)
        #: The served model's preprocessing, once the backend has said (admission's plan).
        self._preprocessing: ModelPreprocessing | None = None

    def _decoded(self, samples: Sequence[DecodeSample], encoded: int, pixels: int) -> None:
        for sample in samples:
            self.admission.observe_decode(
                sample.coding, sample.cpu_seconds, sample.priced_s, sample.items
            )
        # bodies, decoded images (RGBX) and their resize: what may stay in the allocator
        if pixels < 0:  # failures: their churn is unknown, trim as soon as allowed
            self._trimmer.worked(0, failed=True)
        else:
            self._trimmer.worked(encoded * 2 + pixels * 8)

    def admit(
        self, declared_bytes: int | None, key: str | None = None, *, variant: Variant = "open_clip"
    ) -> Reservation:
        """A request's reservation, before its body is read: refused at once when even its
        declared bytes could not be admitted (pipeline/admission.py). ``variant`` is decided
        here, once, for the whole request: whose preprocessing its items get (``immich``:
        images decoded and texts cleaned as Immich's own ML server does, its /predict,
        docs/IMMICH.md), so how its images are priced, looked up in the cache and decoded.
        Its items are added to it as they are read (``Reservation.add``), its body bytes as
        they arrive (``Reservation.received``); ``embed`` takes it. Release it (``with``) once
        answered."""
        plan = self._decode_options(self._preprocessing, variant).plan
        reservation = self.admission.reserve(declared_bytes, key, plan)
        reservation.variant = variant
        if self._cache is not None and self._model is not None:
            reservation.probe = self._probe(self._model, variant)
        return reservation

    def _probe(self, model: ModelInfo, variant: Variant) -> _Probe:
        """The cache lookup for ``model`` and the preprocessing variant."""
        assert self._cache is not None
        identity = _cache.identity(
            model.name, model.embed_dim, model.image_preprocessing, model.quantization,
            model.canary, model.text, variant,
        )  # fmt: skip
        return _Probe(self._cache, identity, self._metrics)

    def _decode_options(self, pre: ModelPreprocessing | None, variant: Variant) -> DecodeOptions:
        """How images are decoded for the served model (``pre``; before the backend has said,
        a 224 px shortest-side resize) and the limits."""
        limits = self._options
        return DecodeOptions(
            size=pre.size if pre else 224,
            max_pixels=limits.max_image_pixels,
            max_bytes=limits.max_image_bytes,
            max_decode_bytes=limits.max_decode_bytes,
            progressive_dc_only=limits.progressive_dc_only,
            resize_mode=pre.resize_mode if pre else "shortest",
            interpolation=pre.interpolation if pre else "bicubic",
            fill_color=pre.fill_color if pre else (0, 0, 0),
            variant=variant,
        )

    async def warm(self) -> None:
        """Run each decoder's one-time set-up before the first request (``BatchDecoder.warm``)."""
        await self._decoder.warm(self._decode_options(None, "open_clip"))

    async def capabilities(self) -> Capabilities:
        """What the served model embeds; BackendUnavailable while the backend cannot say."""
        info = await self._backend.model_info()
        self._preprocessing = info.image_preprocessing
        try:
            self._tokenizer.for_model(info)
            unavailable = None
        except ModalityUnavailable as exc:
            unavailable = exc.reason
        return Capabilities(info, unavailable)

    async def ready(self) -> bool:
        return await self._backend.ready()

    def canary(self, interval_s: float, min_cosine: float, timeout_s: float) -> Canary:
        """The readiness canary over this pipeline's backend and tokenizers."""
        return Canary(self._backend, interval_s, min_cosine, timeout_s, tokenizer=self._tokenizer)

    async def embed(
        self,
        reservation: Reservation,
        items: Sequence[Item],
        *,
        normalize: bool = True,
        skip_invalid: bool = False,
        timeout_s: float | None = None,
    ) -> Embeddings:
        """Embed items admitted on ``reservation`` (each one added to it as it was read)
        within the deadline, or within ``timeout_s`` when that is sooner (what is left of a
        request's deadline after its URL items were fetched), with the preprocessing its
        admission decided (``admit``'s ``variant``); the model and batching are the same."""
        if reservation.admission is not self.admission or reservation.items < len(items):
            raise RuntimeError("embed() takes items admitted on this pipeline's reservation")
        deadline_s = self._options.request_timeout_s
        timeout = deadline_s if timeout_s is None else min(timeout_s, deadline_s)
        try:
            async with asyncio.timeout(timeout):
                return await self._embed(items, normalize, skip_invalid, reservation,
                                         timeout)  # fmt: skip
        except TimeoutError as exc:
            raise DeadlineExceeded(f"request took longer than {deadline_s:g} s") from exc

    async def check_texts(self, items: Sequence[Item]) -> None:
        """Refuse now the first text ``embed`` would refuse (its length, an empty text, no text
        model): checked before work that costs anything, such as fetching URL items."""
        texts = [i for i, item in enumerate(items) if isinstance(item, TextItem)]
        if texts:
            self._embeddable_texts(items, texts, await self._backend.model_info(), False)

    async def _embed(
        self,
        items: Sequence[Item],
        normalize: bool,
        skip_invalid: bool,
        reservation: Reservation,
        timeout_s: float,
    ) -> Embeddings:
        deadline = time.monotonic() + timeout_s
        variant = reservation.variant
        model = await self._backend.model_info()
        self._preprocessing, self._model = model.image_preprocessing, model
        cached = self._cached(items, model, variant, reservation)
        images = [i for i, item in enumerate(items)
                  if not isinstance(item, TextItem) and i not in cached.indices]  # fmt: skip
        texts = [i for i, item in enumerate(items)
                 if isinstance(item, TextItem) and i not in cached.indices]  # fmt: skip
        work: list[Callable[[], Coroutine[Any, Any, _PartialEmbeddings]]] = []
        refused: list[EmbeddingError] = []
        if texts:
            # checked before any work is spent, on texts or images: they cost nothing to check
            good, refused = self._embeddable_texts(items, texts, model, skip_invalid)
            if good:
                work.append(lambda: self._embed_texts(items, good, model, deadline, variant))
        if images:
            meter = self._meter(reservation)
            work.append(
                lambda: self._embed_images(
                    items, images, model, skip_invalid, deadline, variant, meter, reservation
                )
            )
        parts = await _gather_or_cancel([make() for make in work])
        self._remember(items, parts, reservation)
        hit_texts = len(cached.counts)
        cached_counts = (len(cached.indices) - hit_texts, hit_texts)
        if cached.indices:
            parts.append(cached)
        empty = np.empty((0, model.embed_dim), dtype=np.float32)
        vectors = np.concatenate([p.vectors for p in parts]) if parts else empty
        indices = np.array([i for p in parts for i in p.indices], dtype=np.int64)
        order = np.argsort(indices, kind="stable")
        if len(parts) > 1:
            vectors, indices = vectors[order], indices[order]
        if normalize:
            norms = np.linalg.norm(vectors, axis=1, keepdims=True)
            vectors = vectors / np.maximum(norms, np.finfo(np.float32).tiny)
        errors = sorted([*refused, *(e for p in parts for e in p.errors)],
                        key=lambda e: e.index or 0)  # fmt: skip
        image_part = next((p for p in parts if p.kind == "image"), None)
        text_part = next((p for p in parts if p.kind == "text"), None)
        return Embeddings(
            vectors=vectors,
            indices=tuple(int(i) for i in indices),
            errors=tuple(errors),
            model=model,
            image_facts=image_part.image_facts if image_part else (),
            decode_seconds=image_part.prepare_seconds if image_part else 0.0,
            infer_seconds=max((p.infer_seconds for p in parts), default=0.0),
            # answered from the cache or not, an item answered is counted (usage)
            images=(len(image_part.indices) if image_part else 0) + cached_counts[0],
            texts=(len(text_part.indices) if text_part else 0) + cached_counts[1],
            # a text the cache answered counts the tokens the model read the first time
            tokens=sum(p.tokens for p in parts),
            tokenize_seconds=text_part.prepare_seconds if text_part else 0.0,
            image_sizes={i: size for p in parts for i, size in p.sizes.items()},
        )

    def _cached(
        self, items: Sequence[Item], model: ModelInfo, variant: Variant, reservation: Reservation
    ) -> _PartialEmbeddings:
        """The items the cache answers, as a part of their own (no decode, no model call). The
        items were probed as they were admitted; those that were not (the model was not known
        yet) are probed now, and every probe made for another model is made again."""
        empty = _PartialEmbeddings("cached", np.empty((0, model.embed_dim), dtype=np.float32), ())
        if self._cache is None:
            return empty
        probe = self._probe(model, variant)
        made = reservation.probe
        if not isinstance(made, _Probe) or made.identity != probe.identity:
            reservation.keys.clear()
            reservation.hits.clear()
            for item in items:
                found = probe(item)
                if found is not None:
                    reservation.keys[id(item)] = found[0]
                    if found[1] is not None:
                        reservation.hits[id(item)] = found[1]
            reservation.probe = probe
        hits = [(i, reservation.hits[id(item)]) for i, item in enumerate(items)
                if id(item) in reservation.hits]  # fmt: skip
        if not hits:
            return empty
        vectors = np.stack([entry.vector for _, entry in hits]).astype(np.float32)
        return _PartialEmbeddings(
            "cached",
            vectors,
            tuple(i for i, _ in hits),
            counts={i: e.tokens for i, e in hits if isinstance(items[i], TextItem)},
            sizes={i: (e.width, e.height) for i, e in hits if not isinstance(items[i], TextItem)},
        )

    def _remember(
        self, items: Sequence[Item], parts: Sequence[_PartialEmbeddings], reservation: Reservation
    ) -> None:
        """What the model answered (unnormalised) and what the response reported of each item
        besides (its tokens, its size), kept under each item's key."""
        if self._cache is None:
            return
        keys = reservation.keys
        self._cache.put(
            (keys[id(items[i])], _entry(part, row, i))
            for part in parts
            for row, i in enumerate(part.indices)
            if id(items[i]) in keys and id(items[i]) not in reservation.hits
        )

    def _meter(self, reservation: Reservation) -> Meter:
        """The request's decode budget: ``overspend`` times what its images were priced at
        (CPU seconds, at the learned rates but never below the measured factors), at least
        ``METER_FLOOR_S``."""
        admission = self.admission
        budget = max(admission.overspend * reservation.meter_s, METER_FLOOR_S)
        return Meter(reservation.decode_s, budget)

    def _embeddable_texts(
        self, items: Sequence[Item], texts: list[int], model: ModelInfo, skip_invalid: bool
    ) -> tuple[list[int], list[EmbeddingError]]:
        """The texts that can be embedded, and the errors of the others (skip mode; otherwise
        the first error is raised)."""
        errors: list[EmbeddingError] = []
        try:
            self._tokenizer.for_model(model)
        except ModalityUnavailable as exc:
            if not skip_invalid:
                raise ModalityUnavailable(exc.reason, index=texts[0]) from None
            return [], [ModalityUnavailable(exc.reason, index=i) for i in texts]
        good = []
        for i in texts:
            item = items[i]
            assert isinstance(item, TextItem)
            problem = self._tokenizer.problem(item.text, i)
            if problem is None:
                good.append(i)
            elif not skip_invalid:
                raise problem
            else:
                errors.append(problem)
        return good, errors

    async def _embed_images(
        self,
        items: Sequence[Item],
        indices: list[int],
        model: ModelInfo,
        skip_invalid: bool,
        deadline: float,
        variant: Variant,
        meter: Meter | None = None,
        reservation: Reservation | None = None,
    ) -> _PartialEmbeddings:
        limits = self._options
        options = self._decode_options(model.image_preprocessing, variant)
        images: list[ImageItem] = [items[i] for i in indices]  # type: ignore[misc]
        # what admission's pricing read of each image, when it priced the decode that runs
        known = reservation.priced if reservation and reservation.plan == options.plan else {}
        priced = [known.get(id(image)) for image in images] if known else None
        limit = min(limits.max_batch_size or model.max_batch_size, model.max_batch_size)
        # decoded straight into the batch the backend sends from (a shared-memory region when
        # it has one free for a call's worth); given back however this ends
        with self._backend.image_batch(len(images)) as image_batch:
            started = time.perf_counter()
            try:
                decoded = await self._decoder.decode(
                    images,
                    options,
                    skip_invalid=skip_invalid,
                    indices=indices,
                    out=image_batch.pixels,
                    meter=meter,
                    priced=priced,
                )
            finally:  # how close requests come to the meter, stopped or not
                if meter is not None:
                    self._metrics.decode_budget_used.observe(meter.spent_s / meter.budget_s)
            decoded_at = time.perf_counter()
            if decoded.rows:
                kept = image_batch.keep(decoded.rows)
                vectors = await self._infer_in_chunks(
                    self._run_images, kept, limit, deadline, False, model.instances
                )
            else:
                vectors = np.empty((0, model.embed_dim), dtype=np.float32)
        return _PartialEmbeddings(
            "image",
            vectors,
            decoded.indices,
            errors=decoded.errors,
            image_facts=decoded.image_facts,
            prepare_seconds=decoded_at - started,
            infer_seconds=time.perf_counter() - decoded_at,
            sizes=_sizes(decoded.indices, decoded.image_facts),
        )

    async def _embed_texts(
        self,
        items: Sequence[Item],
        indices: list[int],
        model: ModelInfo,
        deadline: float,
        variant: Variant,
    ) -> _PartialEmbeddings:
        assert model.text is not None
        texts: list[TextItem] = [items[i] for i in indices]  # type: ignore[misc]
        started = time.perf_counter()
        tokenizer = self._tokenizer.for_model(model)
        batch = await self._tokenizer.tokenize(texts, indices, tokenizer, variant=variant)
        tokenized_at = time.perf_counter()
        vectors = await self._infer_in_chunks(self._run_texts, _Tokens(batch.tokens),
                                    model.text.max_batch_size, deadline, True,
                                    model.text.instances)  # fmt: skip
        return _PartialEmbeddings(
            "text",
            vectors,
            batch.indices,
            prepare_seconds=tokenized_at - started,
            infer_seconds=time.perf_counter() - tokenized_at,
            counts=dict(zip(batch.indices, batch.counts, strict=True)),
        )

    async def _run_images(self, batch: ImageBatch, deadline: float) -> np.ndarray:
        return await self._backend.embed_images(batch, deadline=deadline)

    async def _run_texts(self, batch: _Tokens, deadline: float) -> np.ndarray:
        return await self._backend.embed_texts(batch.tokens, deadline=deadline)

    async def _infer_in_chunks(
        self,
        call: Callable[[RowsT, float], Awaitable[np.ndarray]],
        batch: RowsT,
        limit: int,
        deadline: float,
        text: bool,
        instances: int = 1,
    ) -> np.ndarray:
        """``batch`` split into chunks of at most ``limit`` rows, each one backend call
        (``_infer_chunk``), run at once; the rows come back in order."""
        # several model instances (the CPU profiles' core plan): one request's rows are shared
        # between them, or a lone batch of 32 would run on one instance's share of the cores
        limit = min(limit, max(1, -(-len(batch) // max(1, instances))))
        if len(batch) <= limit:  # one call: awaited here, no task of its own
            return await self._infer_chunk(call, batch, deadline, text)
        chunks = [batch.rows(i, i + limit) for i in range(0, len(batch), limit)]
        results = await asyncio.gather(
            *(self._infer_chunk(call, chunk, deadline, text) for chunk in chunks)
        )
        return results[0] if len(results) == 1 else np.concatenate(results)

    async def _infer_chunk(
        self,
        call: Callable[[RowsT, float], Awaitable[np.ndarray]],
        chunk: RowsT,
        deadline: float,
        text: bool,
    ) -> np.ndarray:
        started, outcome = time.perf_counter(), "ok"
        self.admission.infer_started(text)
        try:
            rows = await call(chunk, deadline)
            self.admission.infer_finished(len(chunk), text)
            return rows
        except EmbeddingError as exc:
            outcome = _OUTCOMES.get(type(exc), "error")
            self.admission.infer_finished(0, text)
            raise
        except asyncio.CancelledError:
            outcome = "cancelled"
            self.admission.infer_finished(0, text)
            raise
        finally:
            model = "text" if text else "image"
            self._metrics.triton_seconds.labels(model, outcome).observe(
                time.perf_counter() - started
            )
            self._metrics.triton_batch.labels(model).observe(len(chunk))


class _Rows(Protocol):
    """A batch the service splits into calls: an image batch, or token rows."""

    def __len__(self) -> int: ...
    def rows(self, start: int, stop: int) -> Self: ...


RowsT = TypeVar("RowsT", bound=_Rows)


@dataclass(frozen=True)
class _Tokens:
    """Token rows, split into calls as an image batch is."""

    tokens: np.ndarray

    def __len__(self) -> int:
        return len(self.tokens)

    def rows(self, start: int, stop: int) -> Self:
        return type(self)(self.tokens[start:stop])


@dataclass(frozen=True)
class _Probe:
    """One model's and preprocessing's cache lookup (``Reservation.probe``), counted by kind."""

    cache: _cache.EmbeddingCache
    identity: bytes
    metrics: Metrics

    def __call__(self, item: Item) -> tuple[bytes, _cache.Entry | None] | None:
        content = _content(item)
        if content is None:
            return None
        kind, data = content
        key = _cache.key(self.identity, kind, data)
        entry = self.cache.get(key)
        self.metrics.cache_lookups.labels(kind, "miss" if entry is None else "hit").inc()
        return key, entry


def _sizes(indices: Sequence[int], facts: Sequence[Decoded]) -> dict[int, tuple[int, int]]:
    return {i: (f.width, f.height) for i, f in zip(indices, facts, strict=True)}


def _entry(part: _PartialEmbeddings, row: int, index: int) -> _cache.Entry:
    """What the cache keeps of request item ``index``, row ``row`` of ``part``."""
    width, height = part.sizes.get(index, (0, 0))
    return _cache.Entry(part.vectors[row], part.counts.get(index, 0), width, height)


def _content(item: Item) -> tuple[str, bytes] | None:
    """What the cache keys an item by, each one C pass on the event loop at most: a text's
    UTF-8, an image's bytes as sent (raw, or its base64 text: decoding it here would cost
    several times the hash), None for an item that could not be fetched."""
    if isinstance(item, TextItem):
        return "text", item.text.encode("utf-8", "surrogatepass")
    if item.error is not None:
        return None
    if item.b64 is not None:
        return "image-base64", item.b64.encode("utf-8", "surrogatepass")
    return "image", item.data


async def _gather_or_cancel(
    work: list[Coroutine[Any, Any, _PartialEmbeddings]],
) -> list[_PartialEmbeddings]:
    """Run the parts at once; the first failure cancels the others (their model calls too).
    A lone part (a request of images only, or of texts only) is awaited where it is: a task of
    its own would cost the event loop a task's scheduling and nothing else."""
    if len(work) == 1:
        return [await work[0]]
    tasks = [asyncio.ensure_future(w) for w in work]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


#: gateway_triton_request_duration_seconds{outcome}: how a backend call ended.
_OUTCOMES = {
    BackendUnavailable: "backend-unavailable",
    BackendTimeout: "backend-timeout",
    BackendFailed: "backend-error",
}
