"""The server span of each request (clip_gateway/observability/server_spans.py): the span the
OpenTelemetry ASGI instrumentation made, attribute for attribute, at a fraction of its cost."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from litestar import Litestar, get, post
from litestar.middleware import DefineMiddleware
from litestar.plugins.opentelemetry import OpenTelemetryConfig
from litestar.testing import TestClient
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased
from opentelemetry.trace import SpanKind, StatusCode

from clip_gateway.observability.server_spans import ServerSpans

TRACE, CLIENT_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
EXCLUDED = ("/healthz",)


@post("/v1/embeddings", status_code=200)
async def embed() -> dict[str, str]:
    return {"ok": "yes"}


@get("/broken")
async def broken() -> None:
    raise RuntimeError("a bug")


@get("/refused", status_code=422)
async def refused() -> None:
    return None


@get("/healthz")
async def healthz() -> str:
    return "ok"


def _spans(
    middleware: Any,
    exporter: InMemorySpanExporter,
    path: str = "/v1/embeddings",
    headers: dict[str, str] | None = None,
) -> list[ReadableSpan]:
    app = Litestar([embed, broken, refused, healthz], middleware=[middleware])
    with TestClient(app, raise_server_exceptions=False) as client:
        method = client.post if path == "/v1/embeddings" else client.get
        method(f"{path}?batch=1", headers={"user-agent": "photos/1.0", **(headers or {})})
    return [s for s in exporter.get_finished_spans() if s.kind == SpanKind.SERVER]


@pytest.fixture
def traced() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ParentBased(ALWAYS_ON))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def ours(provider: TracerProvider) -> DefineMiddleware:
    return DefineMiddleware(ServerSpans, tracer=provider.get_tracer("gateway"), exclude=EXCLUDED)


def theirs(provider: TracerProvider) -> Any:
    return OpenTelemetryConfig(
        tracer_provider=provider, exclude_spans=["receive", "send"], exclude=list(EXCLUDED)
    ).middleware


@pytest.mark.parametrize("path", ["/v1/embeddings", "/broken", "/refused"])
def test_the_span_the_instrumentation_made(traced: Any, path: str) -> None:
    provider, exporter = traced
    headers = {"traceparent": f"00-{TRACE}-{CLIENT_SPAN}-01", "tracestate": "vendor=1"}
    (expected,) = _spans(theirs(provider), exporter, path, headers)
    exporter.clear()
    (span,) = _spans(ours(provider), exporter, path, headers)
    assert (span.name, span.kind) == (expected.name, expected.kind)
    assert dict(span.attributes or {}) == dict(expected.attributes or {})
    assert span.status.status_code == expected.status.status_code
    assert span.parent is not None and expected.parent is not None
    assert (span.parent.trace_id, span.parent.span_id, span.parent.is_remote) == (
        expected.parent.trace_id, expected.parent.span_id, True
    )  # fmt: skip
    assert span.context is not None and span.context.trace_id == int(TRACE, 16)
    assert expected.context is not None
    assert str(span.context.trace_state) == str(expected.context.trace_state)


def test_the_status_says_what_failed(traced: Any) -> None:
    provider, exporter = traced
    codes = {}
    for path in ("/v1/embeddings", "/refused", "/broken"):
        exporter.clear()
        (span,) = _spans(ours(provider), exporter, path)
        codes[path] = (span.attributes or {})["http.status_code"], span.status.status_code
        assert span.parent is None  # no traceparent: a trace of its own
    assert codes == {
        "/v1/embeddings": (200, StatusCode.UNSET),
        "/refused": (422, StatusCode.UNSET),  # the client's fault: not the server's error
        "/broken": (500, StatusCode.ERROR),
    }


def test_excluded_paths_and_unsampled_requests_leave_no_span(traced: Any) -> None:
    provider, exporter = traced
    assert _spans(ours(provider), exporter, "/healthz") == []
    unsampled = {"traceparent": f"00-{TRACE}-{CLIENT_SPAN}-00"}
    assert _spans(ours(provider), exporter, headers=unsampled) == []
    exporter_off = InMemorySpanExporter()
    off = TracerProvider(sampler=ALWAYS_OFF)
    off.add_span_processor(SimpleSpanProcessor(exporter_off))
    assert _spans(ours(off), exporter_off) == []
    assert _spans(ours(provider), exporter) != []  # the same request, sampled
