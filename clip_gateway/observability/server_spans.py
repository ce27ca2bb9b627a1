"""The server span of each HTTP request: the trace every other span of the request hangs off.

What the OpenTelemetry ASGI instrumentation (behind Litestar's ``OpenTelemetryConfig``) made,
attribute for attribute (its default, pre-stable HTTP conventions) and under the same name
(``POST /v1/embeddings``), in a fraction of its cost. It spent 48 µs of CPU per request beyond
the app unsampled and 78 sampled, this one 12 and 33 (an in-process Litestar app, 13.6 µs a
request without either; docs/OBSERVABILITY.md): the instrumentation wraps every ASGI
message in spans and context switches of its own, reads its settings from the environment and
records metrics through a meter nobody reads (the gateway's metrics are Prometheus's,
observability/metrics.py). Here: one span, one context attach, and ``send`` wrapped only to
read the status.

The incoming context (``traceparent``, ``tracestate``, ``baggage``) is read with the globally
configured propagator, as the instrumentation did; whether the span is sampled is the tracer
provider's decision (observability/tracing.py: at the edge, ``GATEWAY_TRACE_SAMPLE_RATIO``).
"""

from __future__ import annotations

from collections.abc import Iterable

from litestar.enums import ScopeType
from litestar.types import ASGIApp, HTTPScope, Message, Receive, Scope, Send
from opentelemetry import propagate
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer
from opentelemetry.util.types import AttributeValue

#: The request headers the propagators read (W3C trace context and baggage), lower case.
_PROPAGATED = frozenset({b"traceparent", b"tracestate", b"baggage"})


class ServerSpans:
    """ASGI middleware: one SERVER span around each HTTP request whose path is not excluded."""

    def __init__(self, app: ASGIApp, tracer: Tracer, exclude: Iterable[str] = ()) -> None:
        self.app = app
        self.tracer = tracer
        self.exclude = frozenset(exclude)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP or scope["path"] in self.exclude:
            await self.app(scope, receive, send)
            return
        carrier: dict[str, str] = {}
        host = agent = ""
        for key, value in scope["headers"]:
            if key == b"host":
                host = value.decode("latin-1")
            elif key == b"user-agent":
                agent = value.decode("latin-1")
            elif key in _PROPAGATED:
                carrier[key.decode("latin-1")] = value.decode("latin-1")
        parent = propagate.extract(carrier) if carrier else None
        name = f"{scope['method']} {scope['path']}"
        with self.tracer.start_as_current_span(name, context=parent, kind=SpanKind.SERVER) as span:
            if not span.is_recording():  # not sampled: nothing to record
                await self.app(scope, receive, send)
                return
            span.set_attributes(_attributes(scope, host, agent))

            async def observed(message: Message) -> None:
                if message["type"] == "http.response.start":
                    status = int(message["status"])
                    span.set_attribute("http.status_code", status)
                    if status >= 500:
                        span.set_status(Status(StatusCode.ERROR))
                await send(message)

            await self.app(scope, receive, observed)


def _attributes(scope: HTTPScope, host: str, agent: str) -> dict[str, AttributeValue]:
    """The instrumentation's request attributes (its default HTTP conventions)."""
    scheme, path = str(scope.get("scheme", "http")), str(scope["path"])
    server = scope.get("server") or ("", None)
    query = scope.get("query_string", b"")
    where = host or (f"{server[0]}:{server[1]}" if server[1] is not None else str(server[0]))
    attributes: dict[str, AttributeValue] = {
        "http.scheme": scheme,
        "http.host": where,
        "http.flavor": str(scope.get("http_version", "")),
        "http.target": path,
        "http.url": f"{scheme}://{where}{path}" + (f"?{query.decode('latin-1')}" if query else ""),
        "http.method": str(scope["method"]),
        "http.server_name": where,
        "http.route": f"{scope['method']} {path}",
    }
    if server[1] is not None:
        attributes["net.host.port"] = int(server[1])
    if agent:
        attributes["http.user_agent"] = agent
    if client := scope.get("client"):
        attributes["net.peer.ip"], attributes["net.peer.port"] = str(client[0]), int(client[1])
    return attributes
