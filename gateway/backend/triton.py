"""InferenceBackend over Triton's gRPC API: the only module that imports tritonclient.

One ``grpc.aio`` channel per process, reused by every request; HTTP/2 multiplexes concurrent
calls over it. gRPC errors are translated here, once, into gateway errors.

When Triton runs on the same host (the one-container-per-GPU layout) input batches can skip the
gRPC message: they are copied into a POSIX shared-memory region registered with Triton and the
request only names it. At batch 32 that removes 4.8 MB of protobuf serialisation per call, which
the bench's GIL profile showed to be ~45% of a gateway core's Python time (bench/results).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import numpy as np
from opentelemetry.trace import NoOpTracer, Tracer
from opentelemetry.util.types import AttributeValue
from tritonclient.grpc import InferInput, InferRequestedOutput
from tritonclient.grpc.aio import InferenceServerClient
from tritonclient.utils import InferenceServerException

from gateway.backend import shm
from gateway.backend.contract import CANARY_PARAMETER, INPUT_NAME, OUTPUT_NAME, decode_reference
from gateway.backend.protocol import ModelInfo
from gateway.errors import BackendFailed, BackendTimeout, BackendUnavailable, EmbeddingError
from gateway.observability.tracing import client_span, trace_headers
from gateway.runtime.timings import READY_CHECK_TIMEOUT_S

log = logging.getLogger(__name__)

#: Larger than a max batch of 224x224x3 uint8 (32 images = 4.8 MB) with room to spare.
MAX_MESSAGE_BYTES = 256 << 20
_UNAVAILABLE = {"UNAVAILABLE", "RESOURCE_EXHAUSTED", "CANCELLED", "NOT_FOUND", "ABORTED"}


def _status_name(exc: InferenceServerException) -> str:
    return str(exc.status() or "UNKNOWN").removeprefix("StatusCode.")


def translate(exc: InferenceServerException) -> EmbeddingError:
    """gRPC status → our error; the message is Triton's, never a Python traceback."""
    status = _status_name(exc)
    message = exc.message() or status
    if status == "DEADLINE_EXCEEDED":
        return BackendTimeout(f"Triton did not answer in time: {message}", grpc_status=status)
    if status in _UNAVAILABLE:
        return BackendUnavailable(f"Triton unavailable: {message}", grpc_status=status)
    return BackendFailed(f"Triton failed: {message}", grpc_status=status or "UNKNOWN")


class TritonBackend:
    """Talks to one model on one Triton server."""

    def __init__(
        self,
        url: str,
        model_name: str,
        *,
        info_timeout: float = READY_CHECK_TIMEOUT_S,
        tracer: Tracer | None = None,
        shared_memory_regions: int = 0,
    ) -> None:
        self.url = url
        self.model_name = model_name
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
        self._info: ModelInfo | None = None
        self._info_lock = asyncio.Lock()

    async def model_info(self) -> ModelInfo:
        if self._info is None:
            async with self._info_lock:
                if self._info is None:
                    info = await self._read_model_info()
                    if self._shm_regions:
                        await self._remove_orphans()
                        size = info.max_batch_size * info.image_size**2 * 3
                        self._pool = shm.RegionPool(size, self._shm_regions)
                    self._info = info
        return self._info

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
        try:
            config = await self._client.get_model_config(
                self.model_name, as_json=True, client_timeout=self._info_timeout
            )
        except InferenceServerException as exc:
            raise translate(exc) from exc
        return parse_model_config(config["config"])

    async def infer(self, pixels: np.ndarray, *, deadline: float) -> np.ndarray:
        attributes: dict[str, AttributeValue] = {
            "rpc.system": "grpc",
            "rpc.service": "inference.GRPCInferenceService",
            "rpc.method": "ModelInfer",
            "server.address": self.url,
            "triton.model": self.model_name,
            "triton.batch_size": int(pixels.shape[0]),
        }
        with client_span(self._tracer, "triton.infer", attributes) as span:
            region = self._pool.acquire() if self._pool is not None else None
            span.set_attribute("triton.input_transport", "shared_memory" if region else "grpc")
            try:
                result = await self._call(pixels, deadline, region)
            except InferenceServerException as exc:
                span.set_attribute("rpc.grpc.status_code", _status_name(exc))
                raise translate(exc) from exc
            finally:
                if region is not None and self._pool is not None:
                    self._pool.release(region)
            span.set_attribute("rpc.grpc.status_code", "OK")
        embeddings = result.as_numpy(OUTPUT_NAME)
        if embeddings is None or embeddings.shape[0] != pixels.shape[0]:
            shape = None if embeddings is None else embeddings.shape
            raise BackendFailed(f"Triton returned {shape} for a batch of {pixels.shape[0]}")
        return embeddings  # type: ignore[no-any-return]

    async def _call(self, pixels: np.ndarray, deadline: float, region: shm.Region | None) -> Any:
        tensor = InferInput(INPUT_NAME, list(pixels.shape), "UINT8")
        if region is not None:
            try:
                if await self._register(region):
                    region.view(pixels.shape)[...] = pixels
                    tensor.set_shared_memory(region.name, pixels.nbytes)
                    return await self._send(tensor, deadline)
            except InferenceServerException as exc:
                if "shared memory" not in (exc.message() or "").lower():
                    raise
                # Triton restarted (registrations lost) or cannot map our region: this call
                # goes over gRPC, the next registers again.
                log.warning("shared-memory input refused (%s); falling back to gRPC", exc.message())
                self._registered.clear()
                tensor = InferInput(INPUT_NAME, list(pixels.shape), "UINT8")
        tensor.set_data_from_numpy(pixels)
        return await self._send(tensor, deadline)

    async def _send(self, tensor: InferInput, deadline: float) -> Any:
        timeout = max(deadline - time.monotonic(), 0.001)
        return await self._client.infer(
            self.model_name,
            [tensor],
            outputs=[InferRequestedOutput(OUTPUT_NAME)],
            client_timeout=timeout,
            # Triton drops the request itself if it is still queued when we give up.
            timeout=int(timeout * 1e6),
            # W3C traceparent in the gRPC metadata: Triton's spans join this trace.
            headers=trace_headers(),
        )

    async def ready(self) -> bool:
        try:
            return bool(
                await self._client.is_model_ready(
                    self.model_name, client_timeout=self._info_timeout
                )
            )
        except InferenceServerException:
            return False

    async def _register(self, region: shm.Region) -> bool:
        """Register ``region`` with Triton once; False: Triton cannot map our regions (another
        host, no shared /dev/shm), so the pool switches itself off and gRPC carries the data."""
        if region.name in self._registered:
            return True
        try:
            await self._client.register_system_shared_memory(
                region.name, f"/{region.name}", region.byte_size
            )
        except InferenceServerException as exc:
            if _status_name(exc) in _UNAVAILABLE:
                raise  # Triton is down, not incompatible: the caller reports that
            log.warning("Triton cannot map shared memory (%s); using gRPC", exc.message())
            if self._pool is not None:
                self._pool.disable()
            return False
        self._registered.add(region.name)
        return True

    async def close(self) -> None:
        if self._pool is not None:
            for region in self._pool.created:
                if region.name in self._registered:  # Triton may be gone: nothing to undo then
                    with contextlib.suppress(InferenceServerException):
                        await self._client.unregister_system_shared_memory(region.name)
            self._pool.close()
        await self._client.close()


def parse_model_config(config: dict[str, Any]) -> ModelInfo:
    """Check Triton's view of the model against our contract and extract its sizes."""
    inputs = {t["name"]: t for t in config.get("input", [])}
    outputs = {t["name"]: t for t in config.get("output", [])}
    if INPUT_NAME not in inputs or OUTPUT_NAME not in outputs:
        raise BackendFailed(
            f"model {config.get('name')!r} lacks input {INPUT_NAME!r} or output {OUTPUT_NAME!r}"
        )
    pixels, embedding = inputs[INPUT_NAME], outputs[OUTPUT_NAME]
    dims = [int(d) for d in pixels.get("dims", [])]
    if pixels.get("data_type") != "TYPE_UINT8" or len(dims) != 3 or dims[0] != dims[1]:
        raise BackendFailed(f"unexpected input {pixels}: want TYPE_UINT8 [S, S, 3]")
    if embedding.get("data_type") != "TYPE_FP32":
        raise BackendFailed(f"unexpected output {embedding}: want TYPE_FP32 [D]")
    canary = config.get("parameters", {}).get(CANARY_PARAMETER, {}).get("string_value")
    return ModelInfo(
        name=str(config.get("name")),
        image_size=dims[0],
        embed_dim=int(embedding["dims"][-1]),
        max_batch_size=max(1, int(config.get("max_batch_size", 1))),
        canary=decode_reference(canary) if canary else None,
    )
