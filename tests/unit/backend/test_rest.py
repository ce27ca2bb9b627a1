"""The HTTP inference client against a server on loopback that answers as Triton's HTTP endpoint
does (the integration suite runs it against a real tritonserver): what it sends, what it reads,
and that no answer reaches a call it does not belong to."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import numpy as np
import pytest
import uvloop

from clip_gateway.backend.rest import InferClient, RestError, SharedInput
from clip_gateway.config.processes import reserve_port

Handler = Callable[["Request"], Awaitable[bytes | None]]


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request):
    """Each test on both event loops: the gateway's (uvloop, under uvicorn) and the standard one."""
    return asyncio.run if request.param == "asyncio" else uvloop.run


@dataclass
class Request:
    head: str
    body: bytes
    connection: int

    @property
    def header_json(self) -> dict:
        length = int(self.headers["inference-header-content-length"])
        return json.loads(self.body[:length])

    @property
    def headers(self) -> dict[str, str]:
        lines = self.head.split("\r\n")[1:]
        return {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines if line)}


def answer(rows: np.ndarray, *, name: str = "embedding", extra: bytes = b"") -> bytes:
    rows = rows.astype(np.float32)
    header = json.dumps({"model_name": "m", "outputs": [{
        "name": name, "datatype": "FP32", "shape": list(rows.shape),
        "parameters": {"binary_data_size": rows.nbytes}}]}).encode()  # fmt: skip
    body = header + rows.tobytes() + extra
    return (f"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
            f"Inference-Header-Content-Length: {len(header)}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body  # fmt: skip


def error(status: int, message: str) -> bytes:
    body = json.dumps({"error": message}).encode()
    return (f"HTTP/1.1 {status} Error\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body  # fmt: skip


@dataclass
class Server:
    handler: Handler
    requests: list[Request] = field(default_factory=list)
    connections: int = 0
    #: close each connection after this many answers (a server dropping idle connections)
    answers_per_connection: int = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number, answered = self.connections, 0
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode()
                length = int(next(line.split(":")[1] for line in head.split("\r\n")
                                  if line.lower().startswith("content-length")))  # fmt: skip
                request = Request(head, await reader.readexactly(length), number)
                self.requests.append(request)
                reply = await self.handler(request)
                if reply is None:  # close without answering
                    break
                writer.write(reply)
                await writer.drain()
                answered += 1
                if answered == self.answers_per_connection:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def connected(server: Server, **options: int) -> AsyncIterator[InferClient]:
    """A client of ``server``, listening on a loopback port; both closed at the end."""
    listener = await asyncio.start_server(server.serve, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    client = InferClient(f"http://127.0.0.1:{port}", **options)
    try:
        yield client
    finally:
        await client.close()
        listener.close()


async def call(client: InferClient, source: SharedInput | np.ndarray | None = None) -> np.ndarray:
    return await client.infer(
        "clip_image",
        input_name="pixels",
        datatype="UINT8",
        shape=(2, 4, 4, 3),
        source=source if source is not None else SharedInput("region_a", 96, 32),
        output="embedding",
        timeout_us=1_500_000,
        headers={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
    )


def test_a_shared_memory_call_names_the_region_and_reads_the_binary_output(run) -> None:
    rows = np.arange(8, dtype=np.float32).reshape(2, 4)

    async def main() -> None:
        server = Server(lambda request: asyncio.sleep(0, answer(rows)))
        async with connected(server) as client:
            got = await call(client)
        np.testing.assert_array_equal(got, rows)
        (request,) = server.requests
        assert request.head.startswith("POST /v2/models/clip_image/infer HTTP/1.1\r\n")
        assert request.headers["traceparent"].startswith("00-0af7")
        sent = request.header_json
        assert len(request.body) == int(request.headers["inference-header-content-length"])
        assert sent["inputs"] == [{
            "name": "pixels", "shape": [2, 4, 4, 3], "datatype": "UINT8",
            "parameters": {"shared_memory_region": "region_a", "shared_memory_byte_size": 96,
                           "shared_memory_offset": 32}}]  # fmt: skip
        assert sent["outputs"] == [{"name": "embedding", "parameters": {"binary_data": True}}]
        assert sent["parameters"] == {"timeout": 1_500_000}

    run(main())


def test_a_batch_without_a_region_travels_after_the_json(run) -> None:
    pixels = np.random.default_rng(0).integers(0, 255, (2, 4, 4, 3), dtype=np.uint8)

    async def main() -> None:
        server = Server(lambda request: asyncio.sleep(0, answer(np.ones((2, 4)))))
        async with connected(server) as client:
            await call(client, pixels)
        (request,) = server.requests
        length = int(request.headers["inference-header-content-length"])
        assert request.header_json["inputs"][0]["parameters"] == {"binary_data_size": 96}
        assert request.body[length:] == pixels.tobytes()

    run(main())


@pytest.mark.parametrize(
    ("status", "name"),
    [
        (503, "UNAVAILABLE"),
        (400, "INVALID_ARGUMENT"),
        (500, "INTERNAL"),
        (404, "NOT_FOUND"),
        (502, "HTTP_502"),
    ],
)
def test_an_error_answer_carries_tritons_message_and_status(status: int, name: str, run) -> None:
    async def main() -> None:
        server = Server(lambda request: asyncio.sleep(0, error(status, "failing on purpose")))
        async with connected(server) as client:
            with pytest.raises(RestError) as caught:
                await call(client)
            # the connection is fine after an error answer: the next call reuses it
            with pytest.raises(RestError):
                await call(client)
        assert (caught.value.status, caught.value.message) == (name, "failing on purpose")
        assert server.connections == 1

    run(main())


def test_calls_share_at_most_max_connections_and_every_one_is_kept(run) -> None:
    async def main() -> None:
        in_flight: list[int] = [0, 0]  # now, most

        async def slow(request: Request) -> bytes:
            in_flight[0] += 1
            in_flight[1] = max(in_flight)
            number = len(server.requests)
            await asyncio.sleep(0.01)
            in_flight[0] -= 1
            return answer(np.full((2, 4), number))

        server = Server(slow)
        async with connected(server, max_connections=3) as client:
            for _ in range(3):
                await call(client)
            assert server.connections == 1  # calls in turn: one connection
            rows = await asyncio.gather(*(call(client) for _ in range(8)))
            assert server.connections == 3 and in_flight[1] == 3  # the others waited
            assert len({float(r[0, 0]) for r in rows}) == 8  # each call its own answer
            await asyncio.gather(*(call(client) for _ in range(3)))
            assert server.connections == 3  # kept, not opened again

    run(main())


def test_a_connection_the_server_dropped_while_idle_is_replaced_and_the_call_goes_once(run) -> None:
    async def main() -> None:
        server = Server(lambda request: asyncio.sleep(0, answer(np.zeros((2, 4)))))
        server.answers_per_connection = 1  # closes each connection after its first answer
        async with connected(server) as client:
            for _ in range(3):
                await call(client)
                await asyncio.sleep(0.01)  # the server's close arrives while idle
        assert len(server.requests) == 3
        assert server.connections == 3

    run(main())


def test_a_kept_connection_that_fails_before_any_answer_sends_the_call_again_once(run) -> None:
    """The server's close of an idle connection can cross the next request on the wire: that
    request went nowhere, and goes again on a new connection (once)."""

    async def main() -> None:
        async def second_dropped(request: Request) -> bytes | None:
            on_this = [r for r in server.requests if r.connection == request.connection]
            return None if len(on_this) == 2 else answer(np.zeros((2, 4)))

        server = Server(second_dropped)
        async with connected(server) as client:
            await call(client)
            await call(client)  # dropped on the kept connection, answered on a new one
        assert [r.connection for r in server.requests] == [1, 1, 2]

    run(main())


def test_a_connection_closed_mid_call_fails_that_call_and_is_not_retried(run) -> None:
    async def main() -> None:
        server = Server(lambda request: asyncio.sleep(0, None))  # reads the request, hangs up
        async with connected(server) as client:
            with pytest.raises(RestError) as caught:
                await call(client)
        assert caught.value.status == "UNAVAILABLE"
        assert len(server.requests) == 1

    run(main())


def test_an_answer_that_comes_after_its_caller_gave_up_reaches_no_other_call(run) -> None:
    async def main() -> None:
        async def first_slow(request: Request) -> bytes:
            if len(server.requests) == 1:
                await asyncio.sleep(0.3)
                return answer(np.full((2, 4), 1.0))
            return answer(np.full((2, 4), 2.0))

        server = Server(first_slow)
        async with connected(server) as client:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.05):
                    await call(client)
            got = await call(client)
            await asyncio.sleep(0.4)  # the late answer arrives meanwhile
            again = await call(client)
        assert (got == 2.0).all() and (again == 2.0).all()
        assert server.connections == 2  # the abandoned connection was closed, not reused

    run(main())


@pytest.mark.parametrize(
    "reply",
    [
        answer(np.zeros((2, 4)), name="other"),  # not the output asked for
        answer(np.zeros((2, 4)))[:-4] + b"",  # fewer bytes than the header says: never ends
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}",  # no tensor header length
        b"NOT HTTP AT ALL\r\n\r\n",
    ],
    ids=["other-output", "short", "no-header-length", "not-http"],
)
def test_an_answer_that_breaks_the_format_is_an_error_not_an_array(reply: bytes, run) -> None:
    async def main() -> None:
        server = Server(lambda request: asyncio.sleep(0, reply))
        async with connected(server) as client:
            async with asyncio.timeout(1):
                with pytest.raises((RestError, TimeoutError)) as caught:
                    async with asyncio.timeout(0.3):
                        await call(client)
        if isinstance(caught.value, RestError):
            assert caught.value.status == "INTERNAL"

    run(main())


def test_a_declared_size_that_disagrees_with_the_shape_is_refused(run) -> None:
    output = {"name": "embedding", "datatype": "FP32", "shape": [2, 4]}
    output["parameters"] = {"binary_data_size": 4}
    header = json.dumps({"outputs": [output]}).encode()
    body = header + b"\0" * 4
    reply = (f"HTTP/1.1 200 OK\r\nInference-Header-Content-Length: {len(header)}\r\n"
             f"Content-Length: {len(body)}\r\n\r\n").encode() + body  # fmt: skip

    async def main() -> None:
        async with connected(Server(lambda request: asyncio.sleep(0, reply))) as client:
            with pytest.raises(RestError, match="tensor format"):
                await call(client)

    run(main())


def test_an_answer_larger_than_the_bound_is_cut_off(run) -> None:
    async def main() -> None:
        big = answer(np.zeros((2, 4)), extra=b"x" * 100_000)
        server = Server(lambda request: asyncio.sleep(0, big))
        async with connected(server, max_response_bytes=10_000) as client:
            with pytest.raises(RestError, match="exceeds 10000 bytes"):
                await call(client)
            assert not client._idle  # the connection was closed, not kept

    run(main())


def test_nothing_listening_is_unavailable(run) -> None:
    nothing = reserve_port()

    async def main() -> None:
        client = InferClient(f"http://127.0.0.1:{nothing.port}")
        with pytest.raises(RestError) as caught:
            await call(client)
        assert caught.value.status == "UNAVAILABLE"
        assert "cannot connect" in caught.value.message

    try:
        run(main())
    finally:
        nothing.release()


@pytest.mark.parametrize("url", ["127.0.0.1:8000", "http://127.0.0.1:8000/"])
def test_the_url_is_host_and_port(url: str) -> None:
    assert InferClient(url).url == "http://127.0.0.1:8000"


@pytest.mark.parametrize("url", ["https://127.0.0.1:8000", "http://127.0.0.1", "unix:/x"])
def test_a_url_that_is_not_plain_http_with_a_port_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="http://host:port"):
        InferClient(url)


def test_a_header_value_with_a_line_break_is_refused_before_sending(run) -> None:
    async def main() -> None:
        server = Server(lambda request: asyncio.sleep(0, answer(np.zeros((2, 4)))))
        async with connected(server) as client:
            with pytest.raises(ValueError, match="line break"):
                await client.infer("m", input_name="pixels", datatype="UINT8", shape=(2, 4, 4, 3),
                                   source=SharedInput("r", 96), output="embedding",
                                   timeout_us=1, headers={"x": "a\r\nInjected: 1"})  # fmt: skip
        assert server.requests == []

    run(main())
