"""InferenceBackend over Triton's gRPC API: the only module that imports tritonclient.

One ``grpc.aio`` channel per process, reused by every request; HTTP/2 multiplexes concurrent
calls over it. Given Triton's HTTP endpoint too (the launcher gives it), the inference calls go
there instead (``backend/rest.py``: a third of the CPU per call here, less in Triton), and
gRPC keeps the model configs, readiness and the shared-memory registrations. Errors of either
are translated here, once, into gateway errors.

When Triton runs on the same host (the one-container-per-GPU layout) input batches can skip the
gRPC message: they are copied into a POSIX shared-memory region registered with Triton and the
request only names it. At batch 32 that removes 4.8 MB of protobuf serialisation per call, which
the bench's GIL profile showed to be ~45% of a gateway core's Python time (bench/results).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re
import time
from typing import Any, Literal

import numpy as np
from opentelemetry.trace import NoOpTracer, Tracer
from opentelemetry.util.types import AttributeValue
from tritonclient.grpc import InferInput, InferRequestedOutput
from tritonclient.grpc.aio import InferenceServerClient
from tritonclient.utils import InferenceServerException

from clip_gateway.backend import rest, shm
from clip_gateway.backend.model_config import parse_model_config, parse_text_config
from clip_gateway.backend.protocol import ImageBatch, ModelInfo
from clip_gateway.config.timings import READY_CHECK_TIMEOUT_S
from clip_gateway.errors import BackendFailed, BackendTimeout, BackendUnavailable, EmbeddingError
from clip_gateway.model.contract import (
    INPUT_NAME,
    OUTPUT_NAME,
    TEXT_INPUT_NAME,
    TEXT_MODEL_NAME,
)
from clip_gateway.observability.tracing import client_span, trace_headers

log = logging.getLogger(__name__)

#: Larger than a max batch of 224x224x3 uint8 (32 images = 4.8 MB) with room to spare.
MAX_MESSAGE_BYTES = 256 << 20
#: How often the served models' configs are read again (``model_info``): a reload shows within it.
INFO_REFRESH_S = 10.0
#: How soon a read that found the text model mid-reload is tried again.
RELOAD_RETRY_S = 1.0
_UNAVAILABLE = {"UNAVAILABLE", "RESOURCE_EXHAUSTED", "CANCELLED", "NOT_FOUND", "ABORTED"}
#: Each model's input tensor: its name and Triton type (False: image, True: text).
_INPUTS = {False: (INPUT_NAME, "UINT8"), True: (TEXT_INPUT_NAME, "INT32")}
#: The first Triton whose tracer survives traced load. Before it, a trace released while another
#: thread still held its mutex was a use after free (triton-inference-server/server#7795, fixed
#: by #8144 in 2.57.0): Triton 2.51 segfaulted here after 7,224 and 59,922 traced requests at 16
#: in flight (docs/OBSERVABILITY.md). Triton traces exactly the requests that carry a
#: traceparent (rate 0), so sending none keeps an older Triton out of that code.
TRACER_FIXED = (2, 57)
TritonSpans = Literal["auto", "on", "off"]


def triton_version(text: str) -> tuple[int, int] | None:
    """(major, minor) of a Triton version string (server metadata's ``version``), if it is one."""
    match = re.match(r"\s*(\d+)\.(\d+)", text)
    return (int(match[1]), int(match[2])) if match else None


def spans_wanted(setting: TritonSpans, version: str) -> bool:
    """Whether the gateway's trace context goes to this Triton (so Triton adds its spans).
    ``auto``: only to a Triton whose tracer is fixed; an unknown version is taken as unfixed."""
    if setting != "auto":
        return setting == "on"
    parsed = triton_version(version)
    return parsed is not None and parsed >= TRACER_FIXED


def _status_name(exc: InferenceServerException) -> str:
    return str(exc.status() or "UNKNOWN").removeprefix("StatusCode.")


def _message(exc: InferenceServerException | rest.RestError) -> str:
    return exc.message if isinstance(exc, rest.RestError) else (exc.message() or "")


def translate(exc: InferenceServerException | rest.RestError) -> EmbeddingError:
    """gRPC status (or the HTTP endpoint's, by the same names) → our error; the message is
    Triton's, never a Python traceback."""
    status = exc.status if isinstance(exc, rest.RestError) else _status_name(exc)
    message = _message(exc) or status
    if status == "DEADLINE_EXCEEDED":
        return BackendTimeout(f"Triton did not answer in time: {message}", grpc_status=status)
    if status in _UNAVAILABLE:
        return BackendUnavailable(f"Triton unavailable: {message}", grpc_status=status)
    return BackendFailed(f"Triton failed: {message}", grpc_status=status or "UNKNOWN")


class TritonBackend:
    """Talks to the image model (and the text model beside it, when there is one) on one Triton
    server."""

    def __init__(
        self,
        url: str,
        model_name: str,
        *,
        text_model_name: str = TEXT_MODEL_NAME,
        info_timeout: float = READY_CHECK_TIMEOUT_S,
        tracer: Tracer | None = None,
        shared_memory_regions: int = 0,
        triton_spans: TritonSpans = "auto",
        http_url: str | None = None,
    ) -> None:
        self.url = url
        #: the inference calls' client, when Triton's HTTP endpoint is known; else gRPC's
        self._rest = rest.InferClient(http_url) if http_url else None
        self.model_name = model_name
        self.text_model_name = text_model_name
        self._info_timeout = info_timeout
        self._tracer = tracer or NoOpTracer()
        self._client = InferenceServerClient(
            url,
            channel_args=[
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                # Reconnect quickly after Triton restarts (default backoff grows to 120 s).
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 2000),
                ("grpc.keepalive_time_ms", 10_000),
                ("grpc.keepalive_timeout_ms", 5_000),
            ],
        )
        self._shm_regions = shared_memory_regions
        self._pool: shm.RegionPool | None = None
        self._registered: set[str] = set()
        #: Registrations under way, shared by every call that needs the same region meanwhile.
        self._registering: dict[str, asyncio.Task[bool]] = {}
        self._info: ModelInfo | None = None
        self._info_read = 0.0
        self._info_lock = asyncio.Lock()
        #: Whether calls carry the trace context: decided with the first model_info, from the
        #: server's version; never before (a call before it has no trace context to lose).
        self._spans = triton_spans == "on"
        self._spans_decided = triton_spans != "auto"

    async def model_info(self) -> ModelInfo:
        """What Triton serves, read once and again every ``INFO_REFRESH_S``: the launcher may
        load the models again while serving (``auto``'s switch to the profile it measured
        fastest), and the quantization, canary and cache identity follow what serves."""
        if self._info is None:
            async with self._info_lock:
                if self._info is None:
                    info = await self._read_model_info()
                    await self._decide_spans()
                    if self._shm_regions:
                        await self._remove_orphans()
                        size = info.max_batch_size * info.image_size**2 * 3
                        self._pool = shm.RegionPool(size, self._shm_regions)
                    self._info, self._info_read = info, time.monotonic()
        elif time.monotonic() - self._info_read > INFO_REFRESH_S and not self._info_lock.locked():
            async with self._info_lock:
                await self._refresh_model_info(self._info)
        return self._info

    async def _refresh_model_info(self, known: ModelInfo) -> None:
        self._info_read = time.monotonic()
        await self._decide_spans()
        try:
            info = await self._read_model_info()
        except (EmbeddingError, InferenceServerException) as exc:
            # Triton restarting or busy: what it served last is still the best answer
            log.debug("model config not read again: %s", exc)
            return
        if _same(info, known):
            return
        if info.text_unavailable is not None and known.text_unavailable is None:
            # the text model being loaded again (Triton knows no config for it meanwhile): texts
            # stay served by what serves them; asked again in a second
            self._info_read = time.monotonic() - max(0.0, INFO_REFRESH_S - RELOAD_RETRY_S)
            return
        if (info.max_batch_size, info.image_size) != (known.max_batch_size, known.image_size):
            # the regions were sized for the old batches: send pixels in the message instead
            self._pool = None
        log.info("Triton serves %s again, now with %s", info.name, info.quantization)
        self._info = info

    async def _decide_spans(self) -> None:
        """``auto``: read Triton's version (server metadata) once; until it is read (Triton not
        answering yet) no call carries the trace context. Nothing to decide with tracing off."""
        if self._spans_decided or isinstance(self._tracer, NoOpTracer):
            return
        try:
            metadata = await self._client.get_server_metadata(
                as_json=True, client_timeout=self._info_timeout
            )
        except InferenceServerException as exc:
            log.debug("Triton's version not read (%s): asked again with the model config", exc)
            return
        version = str(metadata.get("version", ""))
        self._spans, self._spans_decided = spans_wanted("auto", version), True
        if not self._spans:
            log.warning(
                "Triton %s gets no trace context, so it adds no spans of its own: before 2.57 "
                "its tracer crashes the server under traced load "
                "(triton-inference-server/server#7795); the gateway's triton.infer span still "
                "times each call. GATEWAY_TRITON_SPANS=on sends the context anyway.",
                version or "(version unknown)",
            )

    async def _remove_orphans(self) -> None:
        """Regions of workers that died without stopping (killed, crashed): unregister them from
        Triton and unlink them, so a replaced worker leaves nothing behind."""
        try:
            status = await self._client.get_system_shared_memory_status(
                as_json=True, client_timeout=self._info_timeout
            )
        except InferenceServerException:
            return
        registered = [r["name"] for r in status.get("regions", {}).values()]
        for name in shm.orphans(registered):
            with contextlib.suppress(InferenceServerException):
                await self._client.unregister_system_shared_memory(name)
        for name in set(shm.orphans()) | set(shm.orphans(registered)):
            log.info("removed shared-memory region %s of a process that is gone", name)
            shm.unlink(name)

    async def _read_model_info(self) -> ModelInfo:
        config = await self._config(self.model_name)
        if config is None:
            raise BackendUnavailable(f"Triton serves no model {self.model_name!r}")
        info = parse_model_config(config)
        if info.text_unavailable is not None:
            return info
        text = await self._config(self.text_model_name)
        if text is None:
            reason = (
                f"Triton serves no text model ({self.text_model_name!r}): this model repository "
                "was exported before text support; export again to embed texts"
            )
            return dataclasses.replace(info, text_unavailable=reason)
        return parse_text_config(info, text)

    async def _config(self, model: str) -> dict[str, Any] | None:
        """A model's config, or None when Triton does not know the model."""
        try:
            answer = await self._client.get_model_config(
                model, as_json=True, client_timeout=self._info_timeout
            )
        except InferenceServerException as exc:
            if "unknown model" in (exc.message() or "").lower():
                return None
            raise translate(exc) from exc
        config: dict[str, Any] = answer["config"]
        return config

    def image_batch(self, count: int) -> ImageBatch:
        """A batch the decoders write into. One call's worth (up to the max batch) lies in a
        region's memory when one is free: ``embed_images`` then sends it by name with no copy
        (4.8 MB per batch of 32 not copied on the event loop, and no fresh pages for the kernel
        to fault in and zero); leaving the batch gives the region back."""
        info, pool = self._info, self._pool
        if info is None:
            raise BackendUnavailable("the model is not known yet: ask model_info first")
        shape = (count, info.image_size, info.image_size, 3)
        region = pool.acquire() if pool is not None and 0 < count <= info.max_batch_size else None
        if region is None:
            return ImageBatch(np.empty(shape, dtype=np.uint8))
        return ImageBatch(region.view(shape), region=region, on_close=lambda: self._give(region))

    def _give(self, region: shm.Region) -> None:
        if self._pool is not None and self._pool.capacity:
            self._pool.release(region)

    async def embed_images(self, batch: ImageBatch, *, deadline: float) -> np.ndarray:
        return await self._infer(self.model_name, batch.pixels, deadline, batch)

    async def embed_texts(self, tokens: np.ndarray, *, deadline: float) -> np.ndarray:
        # a batch of token rows is a few KB: the gRPC message carries it
        return await self._infer(self.text_model_name, tokens, deadline, None)

    async def _infer(
        self, model: str, batch: np.ndarray, deadline: float, images: ImageBatch | None
    ) -> np.ndarray:
        attributes: dict[str, AttributeValue] = {
            "triton.model": model,
            "triton.batch_size": int(batch.shape[0]),
        }
        if self._rest is None:
            attributes |= {
                "rpc.system": "grpc",
                "rpc.service": "inference.GRPCInferenceService",
                "rpc.method": "ModelInfer",
                "server.address": self.url,
            }
        else:
            attributes |= {"http.request.method": "POST", "server.address": self._rest.url}
        pool = self._pool if images is not None else None
        with client_span(self._tracer, "triton.infer", attributes) as span:
            # a batch lent in a region is sent from it; a plain one is copied into a free
            # region, when there is one, or else sent in the gRPC message
            staged = images.region if images is not None and pool is not None else None
            offset = images.offset if staged is not None and images is not None else 0
            region = staged or (pool.acquire() if pool is not None else None)
            span.set_attribute("triton.input_transport", "shared_memory" if region
                               else "grpc" if self._rest is None else "http")  # fmt: skip
            status = "rpc.grpc.status_code" if self._rest is None else "triton.status_code"
            try:
                embeddings = await self._call(
                    model, batch, deadline, region, staged is not None, offset
                )
            except (InferenceServerException, rest.RestError) as exc:
                span.set_attribute(
                    status, exc.status if isinstance(exc, rest.RestError) else _status_name(exc)
                )
                raise translate(exc) from exc
            finally:
                if region is not None and pool is not None and staged is None:
                    pool.release(region)
            span.set_attribute(status, "OK")
        if embeddings is None or embeddings.shape[0] != batch.shape[0]:
            shape = None if embeddings is None else embeddings.shape
            raise BackendFailed(f"Triton returned {shape} for a batch of {batch.shape[0]}")
        return embeddings

    async def _call(
        self,
        model: str,
        batch: np.ndarray,
        deadline: float,
        region: shm.Region | None,
        in_place: bool = False,
        offset: int = 0,
    ) -> np.ndarray | None:
        if region is not None:
            try:
                if await self._register(region):
                    if not in_place:  # a lent batch was decoded into the region already
                        region.view(batch.shape)[...] = batch
                    shared = rest.SharedInput(region.name, batch.nbytes, offset)
                    return await self._send(model, batch, deadline, shared)
            except (InferenceServerException, rest.RestError) as exc:
                if "shared memory" not in _message(exc).lower():
                    raise
                # Triton restarted (registrations lost) or cannot map our region: this call
                # carries its batch in the message, the next registers again.
                log.warning("shared-memory input refused (%s); sending the batch instead",
                            _message(exc))  # fmt: skip
                self._registered.clear()
        return await self._send(model, batch, deadline, None)

    async def _send(
        self, model: str, batch: np.ndarray, deadline: float, shared: rest.SharedInput | None
    ) -> np.ndarray | None:
        name, dtype = _INPUTS[model == self.text_model_name]
        timeout = max(deadline - time.monotonic(), 0.001)
        # W3C traceparent in the call's metadata or headers: Triton's spans join this trace
        headers = trace_headers() if self._spans else None
        if self._rest is not None:
            try:
                async with asyncio.timeout(timeout):
                    return await self._rest.infer(
                        model,
                        input_name=name,
                        datatype=dtype,
                        shape=batch.shape,
                        source=batch if shared is None else shared,
                        output=OUTPUT_NAME,
                        # Triton drops the request itself if it is still queued when we give up
                        timeout_us=int(timeout * 1e6),
                        headers=headers,
                    )
            except TimeoutError:
                raise rest.RestError("DEADLINE_EXCEEDED", f"no answer in {timeout:.3f} s") from None
        tensor = InferInput(name, list(batch.shape), dtype)
        if shared is None:
            tensor.set_data_from_numpy(batch)
        else:
            tensor.set_shared_memory(shared.region, shared.byte_size, shared.offset)
        result = await self._client.infer(
            model,
            [tensor],
            outputs=[InferRequestedOutput(OUTPUT_NAME)],
            client_timeout=timeout,
            timeout=int(timeout * 1e6),
            headers=headers,
        )
        embeddings: np.ndarray | None = result.as_numpy(OUTPUT_NAME)
        return embeddings

    async def ready(self) -> bool:
        """Every model served is READY (the text model too, when there is one)."""
        try:
            info = await self.model_info()
            models = [self.model_name] + ([info.text.name] if info.text is not None else [])
            for model in models:
                if not await self._client.is_model_ready(model, client_timeout=self._info_timeout):
                    return False
        except (InferenceServerException, EmbeddingError):
            return False
        return True

    async def _register(self, region: shm.Region) -> bool:
        """Register ``region`` with Triton once; False: Triton cannot map our regions (another
        host, no shared /dev/shm), so the pool switches itself off and gRPC carries the data.

        One registration per region, whoever asks meanwhile, and shielded from the caller's
        cancellation: a request cancelled while its region's registration was in flight left
        Triton holding a name this worker thought unregistered, and the next use of the region
        ("already in manager") switched shared memory off for the worker's lifetime (seen on a
        GPU host: most of 8 workers sent 4.8 MB gRPC messages instead, docs/GPU_HOST.md)."""
        if region.name in self._registered:
            return True
        task = self._registering.get(region.name)
        if task is None:
            task = asyncio.ensure_future(self._register_once(region))
            self._registering[region.name] = task
            task.add_done_callback(lambda _: self._registering.pop(region.name, None))
        return await asyncio.shield(task)

    async def _register_once(self, region: shm.Region) -> bool:
        try:
            await self._client.register_system_shared_memory(
                region.name, f"/{region.name}", region.byte_size
            )
        except InferenceServerException as exc:
            if _status_name(exc) in _UNAVAILABLE:
                raise  # Triton is down, not incompatible: the caller reports that
            if "already in manager" not in (exc.message() or ""):
                log.warning("Triton cannot map shared memory (%s); using gRPC", exc.message())
                if self._pool is not None:
                    self._pool.disable()
                return False
            # the name is this process's own (its pid and a random token, shm.py): Triton kept
            # an earlier registration of it whose answer never reached us, or that we forgot
            # after a refused call
        self._registered.add(region.name)
        return True

    async def close(self) -> None:
        if self._pool is not None:
            for region in self._pool.created:
                if region.name in self._registered:  # Triton may be gone: nothing to undo then
                    with contextlib.suppress(InferenceServerException):
                        await self._client.unregister_system_shared_memory(region.name)
            self._pool.close()
        if self._rest is not None:
            await self._rest.close()
        await self._client.close()


def _same(a: ModelInfo, b: ModelInfo) -> bool:
    """Whether two reads of the configs describe the same served models: the fields a dataclass
    compares, and the quantization and canary it leaves out (a profile switch changes those)."""
    canaries = (a.canary is None and b.canary is None) or (
        a.canary is not None and b.canary is not None and np.array_equal(a.canary, b.canary)
    )
    return a == b and a.quantization == b.quantization and canaries
