"""A real gateway process on the deterministic fake backend: ``python -m tests.netns.gateway``
runs uvicorn with the gateway's own server config (its HTTP protocol, head limits, admission's
Retry-After) and ``create_app`` from the environment's settings, the model replaced by
``tests.fakes.FakeBackend`` (with a text model when ``CLIP_GATEWAY_TEST_TOKENIZER`` names the
tokenizer file). ``FakeGateway`` starts it as ``GatewayProcess`` starts the real one.

With ``CLIP_GATEWAY_TEST_TRACEMALLOC=1`` the process traces its Python allocations and answers
``GET /_test/memory`` (outside the app) with the traced bytes now and at their peak since the
last ``?reset=1``: what a test holds a memory bound to, in the process that allocates."""

from __future__ import annotations

import functools
import json
import os
import sys
import tracemalloc
from dataclasses import dataclass
from typing import Any

import uvicorn
from litestar import Litestar

from clip_gateway.config.processes import GatewayProcess
from clip_gateway.config.settings import ServerSettings
from clip_gateway.http import connections
from clip_gateway.http.app import ServerConfig, create_app, retry_after_s
from tests.fakes import FakeBackend

TOKENIZER = "CLIP_GATEWAY_TEST_TOKENIZER"
TRACEMALLOC = "CLIP_GATEWAY_TEST_TRACEMALLOC"


class Traced:
    """The app, and ``/_test/memory`` in front of it."""

    def __init__(self, app: Litestar) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/_test/memory":
            await self.app(scope, receive, send)
            return
        current, peak = tracemalloc.get_traced_memory()
        if b"reset=1" in scope.get("query_string", b""):
            tracemalloc.reset_peak()
        body = json.dumps({"current": current, "peak": peak}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


class FakeConfig(ServerConfig):
    def _create_app(self) -> Any:
        settings = ServerSettings()
        tokenizer = os.environ.get(TOKENIZER)
        fake = FakeBackend(max_batch_size=32, tokenizer_file=tokenizer)
        app = create_app(settings, lambda *_: fake)
        self._protocol = connections.protocol(
            connections.HeadLimits.of(settings), functools.partial(retry_after_s, app)
        )
        if os.environ.get(TRACEMALLOC) == "1":
            tracemalloc.start()
            return Traced(app)
        return app


@dataclass
class FakeGateway(GatewayProcess):
    """The gateway's HTTP process on the fake backend (no Triton; ``triton_url`` is unused)."""

    def command(self) -> list[str]:
        return [sys.executable, "-m", "tests.netns.gateway"]


def main() -> None:
    settings = ServerSettings()
    config = FakeConfig(
        "clip_gateway.http.app:create_app",
        factory=True,
        fd=settings.listen_fd,
        workers=1,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=1,
    )
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
