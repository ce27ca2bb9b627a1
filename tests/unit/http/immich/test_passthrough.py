"""Immich's pass-through (http/immich/passthrough.py): the look at a /predict body that decides
where it goes (the form reader with a stop, through http/body.py's ``peek``), which leaves the
body whole for whichever path takes it; and the upstream client's life on app.state. Forwards
against a real upstream: tests/api/test_immich_upstream.py, tests/netns/test_immich_proxy.py."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from litestar.datastructures import State

from clip_gateway.config.settings import ServerSettings
from clip_gateway.http import body
from clip_gateway.http.context import AppContext
from clip_gateway.http.immich import passthrough
from clip_gateway.http.immich.upstream import Upstream
from tests.unit.http.test_body import context_of, request_to

BOUNDARY = "imm1ch"
FORM = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
ENTRIES = b'{"clip": {"visual": {"modelName": "ViT-B-32__openai"}}}'


def part(name: str, data: bytes, headers: str = "") -> bytes:
    head = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n{headers}\r\n'
    return head.encode() + data + b"\r\n"


def sent_in(data: bytes, size: int) -> list[dict[str, Any]]:
    pieces = [data[i : i + size] for i in range(0, len(data), size)]
    return [{"type": "http.request", "body": piece, "more_body": i < len(pieces) - 1}
            for i, piece in enumerate(pieces)]  # fmt: skip


class Client:
    """The body's messages as the channel hands them out, counting those taken."""

    def __init__(self, messages: list[dict[str, Any]]) -> None:
        self.messages, self.taken = messages, 0

    async def __call__(self) -> dict[str, Any]:
        self.taken += 1
        return self.messages[self.taken - 1]


@pytest.fixture
def context() -> Iterator[AppContext]:
    """The app's context on default settings, as the lifespan builds it (fake backend)."""
    with ThreadPoolExecutor(1) as pool:
        made = context_of(ServerSettings(), pool)
        yield made
        asyncio.run(made.http.aclose())


def look(
    context: AppContext, data: bytes, size: int = 1000, headers: dict[str, str] = FORM
) -> tuple[bytes | None, Client, bytes]:
    """What ``entries_of`` found, the channel, and the body read whole afterwards."""
    client = Client(sent_in(data, size))
    request = request_to(context, headers, client)

    async def scenario() -> tuple[bytes | None, bytes]:
        found = await passthrough.entries_of(request, context.settings)
        taken = client.taken
        rest = await body.read_all(body.body_of(request, context.settings, None))
        client.taken = taken
        return found, bytes(rest)

    found, whole = asyncio.run(scenario())
    return found, client, whole


FORM_BODY = part("entries", ENTRIES) + part("image", b"i" * 5000) + f"--{BOUNDARY}--\r\n".encode()


def test_entries_are_read_first_and_the_body_is_left_whole(context: AppContext) -> None:
    found, client, whole = look(context, FORM_BODY)
    assert found == ENTRIES
    assert client.taken == 1  # entries ended in the first message: nothing more read
    assert whole == FORM_BODY  # read again from the first byte


def test_entries_after_another_field_within_reach_are_found(context: AppContext) -> None:
    data = part("assetId", b"a1") + FORM_BODY
    found, _, whole = look(context, data, size=7)
    assert (found, whole) == (ENTRIES, data)


def test_entries_out_of_reach_are_not_looked_for_past_it(context: AppContext) -> None:
    """A form that puts ``entries`` past the first 64 KiB is the upstream's: the look stops at
    the message that passes them."""
    data = part("image", b"i" * 2 * passthrough.PEEK_BYTES) + FORM_BODY
    found, client, whole = look(context, data, size=1 << 14)
    assert found is None
    assert client.taken == passthrough.PEEK_BYTES // (1 << 14) + 1
    assert whole == data


def test_a_body_the_reader_cannot_take_is_left_for_the_upstream(context: AppContext) -> None:
    """More header lines than the parser takes, or not a form: nothing found, nothing lost."""
    extra = "".join(f"X-{i}: v\r\n" for i in range(12))
    many = part("entries", ENTRIES, extra) + f"--{BOUNDARY}--\r\n".encode()
    found, _, whole = look(context, many)
    assert (found, whole) == (None, many)
    found, _, whole = look(context, b"--not-the-boundary\r\n\r\nx")
    assert (found, whole) == (None, b"--not-the-boundary\r\n\r\nx")


def test_a_body_without_a_boundary_is_not_read_to_route_it(context: AppContext) -> None:
    for headers in ({"Content-Type": "application/json"}, {}):
        client = Client(sent_in(b'{"x": 1}', 4))
        found = asyncio.run(
            passthrough.entries_of(request_to(context, headers, client), context.settings)
        )
        assert (found, client.taken) == (None, 0)


def test_the_upstream_client_lives_on_the_apps_state_while_it_runs() -> None:
    state = State()

    async def scenario() -> None:
        async with passthrough.opened(state, ServerSettings(immich=True)):
            assert passthrough.upstream_of(state) is None  # none configured
        settings = ServerSettings(immich=True, immich_upstream=("http://127.0.0.1:9",))
        async with passthrough.opened(state, settings):
            upstream = passthrough.upstream_of(state)
            assert isinstance(upstream, Upstream)
            assert [s.url for s in upstream.states] == ["http://127.0.0.1:9"]
        assert upstream.client.is_closed and upstream.pings.is_closed

    asyncio.run(scenario())
