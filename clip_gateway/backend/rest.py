"""Inference calls to Triton over its HTTP/1.1 endpoint: the KServe v2 ``infer`` request with
Triton's binary tensor extension, on kept-alive loopback connections parsed by httptools.

Why not gRPC for the calls themselves: on a 2-core EPYC VM, one call of one image in shared
memory to a null model cost the calling process ~100-159 us of CPU through tritonclient's
``grpc.aio`` client (its event-engine threads included) and this module ~28-44 us; Triton's
own CPU per call fell from ~93-180 to ~63-95 us; a batch of 32, 288-308 against ~95 us
(docs/PERFORMANCE.md). HTTP clients made for general use cost as much as gRPC here or more
(aiohttp ~130 us a call, httpcore ~330): the saving is in doing only what one request shape to
one local server needs. Everything else (model configs, readiness, shared-memory registration)
stays on gRPC (``backend/triton.py``).

Each connection carries one call at a time. A call that times out or is cancelled closes its
connection (its answer may still come), so no answer can reach another call. What one answer
may hold is bounded (``max_response_bytes``), and so are the connections: at most
``max_connections`` at once, every one kept open for the next call (a call beyond them waits for
one, inside its own deadline), so a burst neither opens connections without bound nor leaves a
trail of closed ones (TIME_WAIT) that could use up the ephemeral ports.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlsplit

import httptools
import numpy as np

#: Triton's ``HttpCodeFromError`` (src/http_server.cc) maps its error codes to these statuses;
#: read back as the gRPC status names the same errors carry on the other endpoint.
_STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    404: "NOT_FOUND",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    503: "UNAVAILABLE",
}
#: (status code, headers by lower-case name, body)
_Answer = tuple[int, dict[bytes, bytes], bytes]
_DTYPES = {"UINT8": np.uint8, "INT32": np.int32, "INT64": np.int64, "FP32": np.float32}


class RestError(Exception):
    """Triton answered an inference call with an error, or could not be reached."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        #: the gRPC status name of the same error (``UNAVAILABLE`` when unreachable)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class SharedInput:
    """An input tensor that Triton reads from a registered shared-memory region."""

    region: str
    byte_size: int
    offset: int = 0


class _Connection(asyncio.Protocol):
    """One kept-alive connection: one request at a time, its answer gathered whole."""

    def __init__(self, max_response_bytes: int) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._max = max_response_bytes
        self._received = 0
        self._body: list[bytes] = []
        self._headers: dict[bytes, bytes] = {}
        self._answer: asyncio.Future[_Answer] | None = None
        self.transport: asyncio.Transport | None = None
        self.closed = False
        #: whether any byte of the current answer came (a stale connection fails before)
        self.answered = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is none by class

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(ConnectionError(f"Triton closed the connection ({exc or 'EOF'})"))

    def data_received(self, data: bytes) -> None:
        self.answered = True
        self._received += len(data)
        if self._received > self._max:
            self._fail(RestError("INTERNAL", f"Triton's answer exceeds {self._max} bytes"))
            self.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(RestError("INTERNAL", f"Triton's answer is not valid HTTP: {exc}"))
            self.close()

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.lower()] = value

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        answer = self._answer
        if answer is not None and not answer.done():
            status = self._parser.get_status_code()
            if not self._parser.should_keep_alive():
                self.close()
            answer.set_result((status, self._headers, b"".join(self._body)))

    def _fail(self, exc: Exception) -> None:
        if self._answer is not None and not self._answer.done():
            self._answer.set_exception(exc)

    def send(self, request: list[bytes | memoryview]) -> asyncio.Future[_Answer]:
        assert self.transport is not None
        self._answer = asyncio.get_running_loop().create_future()
        self._body, self._headers, self._received, self.answered = [], {}, 0, False
        if self.closed or self.transport.is_closing():
            self._answer.set_exception(ConnectionError("the connection was closed"))
        else:
            self.transport.writelines(request)
        return self._answer

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class InferClient:
    """``infer`` calls to one Triton's HTTP endpoint (``http://host:port``)."""

    def __init__(
        self, url: str, *, max_connections: int = 64, max_response_bytes: int = 64 << 20
    ) -> None:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme != "http" or not parts.hostname or parts.port is None:
            raise ValueError(f"Triton's HTTP endpoint must be http://host:port, not {url!r}")
        self.url = f"http://{parts.netloc}"
        self._host, self._port = parts.hostname, parts.port
        self._host_header = parts.netloc.encode("ascii")
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(max_connections)
        self._max_response = max_response_bytes

    async def infer(
        self,
        model: str,
        *,
        input_name: str,
        datatype: str,
        shape: tuple[int, ...],
        source: SharedInput | np.ndarray,
        output: str,
        timeout_us: int,
        headers: dict[str, str] | None = None,
    ) -> np.ndarray:
        """The output tensor of one call; ``source``: where Triton reads the input. Raises
        RestError for an error answer or an unreachable server; ``TimeoutError`` and
        cancellation come from the caller's scope, and close the connection in use."""
        tensor: dict[str, Any] = {"name": input_name, "shape": list(shape), "datatype": datatype}
        payload: list[bytes | memoryview] = []
        if isinstance(source, SharedInput):
            tensor["parameters"] = {
                "shared_memory_region": source.region,
                "shared_memory_byte_size": source.byte_size,
                "shared_memory_offset": source.offset,
            }
        else:
            data = np.ascontiguousarray(source).data.cast("B")
            tensor["parameters"] = {"binary_data_size": data.nbytes}
            payload.append(data)
        header = json.dumps(
            {
                "inputs": [tensor],
                "outputs": [{"name": output, "parameters": {"binary_data": True}}],
                "parameters": {"timeout": timeout_us},
            },
            separators=(",", ":"),
        ).encode()
        length = len(header) + sum(part.nbytes if isinstance(part, memoryview) else len(part)
                                   for part in payload)  # fmt: skip
        extra = "".join(f"{name}: {_header_value(value)}\r\n"
                        for name, value in (headers or {}).items())  # fmt: skip
        head = (
            f"POST /v2/models/{model}/infer HTTP/1.1\r\n"
            f"Host: {self._host_header.decode()}\r\n"
            "Content-Type: application/octet-stream\r\n"
            f"Inference-Header-Content-Length: {len(header)}\r\n"
            f"Content-Length: {length}\r\n{extra}\r\n"
        ).encode()
        status, answer_headers, body = await self._exchange([head, header, *payload])
        if status != 200:
            raise RestError(_STATUS_NAMES.get(status, f"HTTP_{status}"), _error_message(body))
        return _output(answer_headers, body, output)

    async def _exchange(self, request: list[bytes | memoryview]) -> _Answer:
        async with self._slots:  # one connection per call in flight, at most max_connections
            return await self._exchange_on_a_connection(request)

    async def _exchange_on_a_connection(self, request: list[bytes | memoryview]) -> _Answer:
        for attempt in range(2):
            while self._idle and self._idle[-1].closed:
                self._idle.pop()
            reused = bool(self._idle)
            connection = self._idle.pop() if reused else await self._connect()
            try:
                answer = await connection.send(request)
            except ConnectionError as exc:
                connection.close()
                # a kept-alive connection Triton closed while idle fails before any answer:
                # the request never ran, so it goes once more on a new connection
                if reused and not connection.answered and attempt == 0:
                    continue
                raise RestError("UNAVAILABLE", str(exc)) from exc
            except BaseException:  # timeout, cancellation, a bad answer: its bytes may follow
                connection.close()
                raise
            if not connection.closed:
                self._idle.append(connection)
            return answer
        raise AssertionError("unreachable")  # pragma: no cover

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, connection = await loop.create_connection(
                lambda: _Connection(self._max_response), self._host, self._port
            )
        except OSError as exc:
            raise RestError("UNAVAILABLE", f"cannot connect to {self.url}: {exc}") from exc
        return connection

    async def close(self) -> None:
        while self._idle:
            self._idle.pop().close()
        await asyncio.sleep(0)  # the transports' close callbacks run


def _header_value(value: str) -> str:
    if "\r" in value or "\n" in value:
        raise ValueError("a header value with a line break")
    return value


def _error_message(body: bytes) -> str:
    with contextlib.suppress(ValueError, AttributeError):
        message = json.loads(body).get("error")
        if isinstance(message, str):
            return message
    return body[:500].decode("utf-8", "replace") or "no message"


def _output(headers: dict[bytes, bytes], body: bytes, name: str) -> np.ndarray:
    """The binary output ``name`` of a 200 answer, checked against what its header says."""
    try:
        size = int(headers[b"inference-header-content-length"])
        meta = json.loads(body[:size])
        outputs = meta["outputs"]
        start = size
        for tensor in outputs:
            nbytes = int(tensor["parameters"]["binary_data_size"])
            if tensor["name"] == name:
                dtype = np.dtype(_DTYPES[tensor["datatype"]])
                shape = tuple(int(d) for d in tensor["shape"])
                if nbytes != dtype.itemsize * int(np.prod(shape)) or start + nbytes > len(body):
                    raise ValueError(f"{nbytes} bytes for {shape} {tensor['datatype']}")
                return np.frombuffer(body, dtype, count=nbytes // dtype.itemsize,
                                     offset=start).reshape(shape)  # fmt: skip
            start += nbytes
    except (KeyError, ValueError, TypeError) as exc:
        raise RestError("INTERNAL", f"Triton's answer breaks the tensor format: {exc!r}") from exc
    raise RestError("INTERNAL", f"Triton's answer has no output {name!r}")
