"""InferenceBackend over Triton's gRPC API: the only module that imports tritonclient.

One ``grpc.aio`` channel is opened per process and reused by every request; HTTP/2 multiplexes
the concurrent calls over it. gRPC errors are translated here, once, into gateway errors.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
from opentelemetry.trace import NoOpTracer, Tracer
from opentelemetry.util.types import AttributeValue
from tritonclient.grpc import InferInput, InferRequestedOutput
from tritonclient.grpc.aio import InferenceServerClient
from tritonclient.utils import InferenceServerException

from gateway.backend import ModelInfo
from gateway.canary import CONFIG_PARAMETER, decode_reference
from gateway.contract import INPUT_NAME, OUTPUT_NAME
from gateway.errors import BackendError, BackendTimeout, BackendUnavailable, GatewayError
from gateway.telemetry import client_span, trace_headers

#: Larger than a max batch of 224x224x3 uint8 (32 images = 4.8 MB) with room to spare.
MAX_MESSAGE_BYTES = 256 << 20
_UNAVAILABLE = {"UNAVAILABLE", "RESOURCE_EXHAUSTED", "CANCELLED", "NOT_FOUND", "ABORTED"}


def _status_name(exc: InferenceServerException) -> str:
    return str(exc.status() or "UNKNOWN").removeprefix("StatusCode.")


def translate(exc: InferenceServerException) -> GatewayError:
    """gRPC status → our error; the message is Triton's, never a Python traceback."""
    status = _status_name(exc)
    message = exc.message() or status
    if status == "DEADLINE_EXCEEDED":
        return BackendTimeout(f"Triton did not answer in time: {message}", grpc_status=status)
    if status in _UNAVAILABLE:
        return BackendUnavailable(f"Triton unavailable: {message}", grpc_status=status)
    return BackendError(f"Triton failed: {message}", grpc_status=status or "UNKNOWN")


class TritonBackend:
    """Talks to one model on one Triton server."""

    def __init__(
        self,
        url: str,
        model_name: str,
        *,
        info_timeout: float = 5.0,
        tracer: Tracer | None = None,
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
        self._info: ModelInfo | None = None
        self._info_lock = asyncio.Lock()

    async def model_info(self) -> ModelInfo:
        if self._info is None:
            async with self._info_lock:
                if self._info is None:
                    self._info = await self._read_model_info()
        return self._info

    async def _read_model_info(self) -> ModelInfo:
        try:
            config = await self._client.get_model_config(
                self.model_name, as_json=True, client_timeout=self._info_timeout
            )
        except InferenceServerException as exc:
            raise translate(exc) from exc
        return parse_model_config(config["config"])

    async def infer(self, pixels: np.ndarray, *, deadline: float) -> np.ndarray:
        timeout = max(deadline - time.monotonic(), 0.001)
        tensor = InferInput(INPUT_NAME, list(pixels.shape), "UINT8")
        tensor.set_data_from_numpy(pixels)
        attributes: dict[str, AttributeValue] = {
            "rpc.system": "grpc",
            "rpc.service": "inference.GRPCInferenceService",
            "rpc.method": "ModelInfer",
            "server.address": self.url,
            "triton.model": self.model_name,
            "triton.batch_size": int(pixels.shape[0]),
        }
        with client_span(self._tracer, "triton.infer", attributes) as span:
            try:
                result = await self._client.infer(
                    self.model_name,
                    [tensor],
                    outputs=[InferRequestedOutput(OUTPUT_NAME)],
                    client_timeout=timeout,
                    # Triton drops the request itself if it is still queued when we give up.
                    timeout=int(timeout * 1e6),
                    # W3C traceparent in the gRPC metadata: Triton's spans join this trace.
                    headers=trace_headers(),
                )
            except InferenceServerException as exc:
                span.set_attribute("rpc.grpc.status_code", _status_name(exc))
                raise translate(exc) from exc
            span.set_attribute("rpc.grpc.status_code", "OK")
        embeddings = result.as_numpy(OUTPUT_NAME)
        if embeddings is None or embeddings.shape[0] != pixels.shape[0]:
            shape = None if embeddings is None else embeddings.shape
            raise BackendError(f"Triton returned {shape} for a batch of {pixels.shape[0]}")
        return embeddings  # type: ignore[no-any-return]

    async def ready(self) -> bool:
        try:
            return bool(
                await self._client.is_model_ready(
                    self.model_name, client_timeout=self._info_timeout
                )
            )
        except InferenceServerException:
            return False

    async def close(self) -> None:
        await self._client.close()


def parse_model_config(config: dict[str, Any]) -> ModelInfo:
    """Check Triton's view of the model against our contract and extract its sizes."""
    inputs = {t["name"]: t for t in config.get("input", [])}
    outputs = {t["name"]: t for t in config.get("output", [])}
    if INPUT_NAME not in inputs or OUTPUT_NAME not in outputs:
        raise BackendError(
            f"model {config.get('name')!r} lacks input {INPUT_NAME!r} or output {OUTPUT_NAME!r}"
        )
    pixels, embedding = inputs[INPUT_NAME], outputs[OUTPUT_NAME]
    dims = [int(d) for d in pixels.get("dims", [])]
    if pixels.get("data_type") != "TYPE_UINT8" or len(dims) != 3 or dims[0] != dims[1]:
        raise BackendError(f"unexpected input {pixels}: want TYPE_UINT8 [S, S, 3]")
    if embedding.get("data_type") != "TYPE_FP32":
        raise BackendError(f"unexpected output {embedding}: want TYPE_FP32 [D]")
    canary = config.get("parameters", {}).get(CONFIG_PARAMETER, {}).get("string_value")
    return ModelInfo(
        name=str(config.get("name")),
        image_size=dims[0],
        embed_dim=int(embedding["dims"][-1]),
        max_batch_size=max(1, int(config.get("max_batch_size", 1))),
        canary=decode_reference(canary) if canary else None,
    )
