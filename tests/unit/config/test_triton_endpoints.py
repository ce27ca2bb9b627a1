"""Where the gateway finds Triton: a bad HTTP endpoint stops the start with its name, not a
traceback on the first call."""

from __future__ import annotations

import pytest

from clip_gateway.config.settings import ServerSettings


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8000", "http://127.0.0.1:8000/", "http://[::1]:8000"]
)
def test_tritons_http_endpoint_is_host_and_port(url: str) -> None:
    assert ServerSettings(triton_http_url=url).triton_http_url == url.rstrip("/")
    assert ServerSettings(triton_http_url="").triton_http_url is None


@pytest.mark.parametrize(
    "url",
    ["127.0.0.1:8000", "https://127.0.0.1:8000", "http://127.0.0.1", "http://h:x", "http://h:1/v2"],
)
def test_a_triton_http_endpoint_that_is_not_http_host_port_is_refused_at_start(url: str) -> None:
    with pytest.raises(ValueError, match="triton_http_url"):
        ServerSettings(triton_http_url=url)
