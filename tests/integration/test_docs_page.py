"""/docs as a person sees it: the real gateway's page opened in a real headless Chromium with
no network but loopback, every operation of the OpenAPI document rendered as an operation block.

Fetching the HTML proves nothing about rendering: Swagger UI 4 fetched fine and then showed
"Unable to render this definition" for an OpenAPI 3.1 document. Needs no Triton: the gateway
serves its documents whether or not its backend is up.
"""

from __future__ import annotations

from collections.abc import Iterator
from html.parser import HTMLParser

import httpx
import pytest

from clip_gateway.config.processes import GatewayProcess, reserve_port
from tests import browser


class Operations(HTMLParser):
    """The (METHOD, path) of each operation block Swagger UI rendered, in page order."""

    def __init__(self) -> None:
        super().__init__()
        self.methods: list[str] = []
        self.paths: list[str] = []
        self._in_method = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        classes = (dict(attrs).get("class") or "").split()
        self._in_method = "opblock-summary-method" in classes
        if "opblock-summary-path" in classes:
            self.paths.append(dict(attrs).get("data-path") or "")

    def handle_data(self, data: str) -> None:
        if self._in_method and data.strip():
            self.methods.append(data.strip())
            self._in_method = False

    @classmethod
    def rendered(cls, dom: str) -> list[tuple[str, str]]:
        parser = cls()
        parser.feed(dom)
        assert len(parser.methods) == len(parser.paths), (parser.methods, parser.paths)
        return list(zip(parser.methods, parser.paths, strict=True))


@pytest.fixture
def gateway_without_triton(start_gateway) -> Iterator[GatewayProcess]:
    nothing_there = reserve_port()  # reserved, so nothing will be listening on it
    try:
        yield start_gateway(
            f"127.0.0.1:{nothing_there.port}", ready=False, GATEWAY_CANARY_INTERVAL_S="0"
        )
    finally:
        nothing_there.release()


def test_docs_render_every_operation_offline(gateway_without_triton: GatewayProcess) -> None:
    url = gateway_without_triton.url
    document = httpx.get(f"{url}/docs/openapi.json", timeout=30).json()
    documented = {(m.upper(), path) for path, ops in document["paths"].items() for m in ops}
    assert {("POST", "/v1/embeddings"), ("GET", "/healthz"), ("GET", "/readyz")} <= documented

    dom = browser.served_dom(f"{url}/docs")
    assert "Unable to render this definition" not in dom
    rendered = Operations.rendered(dom)
    assert len(rendered) == len(set(rendered))  # each operation once
    assert set(rendered) == documented
