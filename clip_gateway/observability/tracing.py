"""OpenTelemetry tracing: provider from the standard OTEL_* variables, spans joined with Triton's.

Off (no OTLP endpoint configured, ``OTEL_SDK_DISABLED=true`` or ``GATEWAY_TRACING=off``) the app
gets no tracing middleware at all and every span below is the API's non-recording span, so the
request path pays a few attribute-less calls. On, the SDK reads the usual variables itself:
``OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT``, ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``;
sampling is the gateway's own (``GATEWAY_TRACE_SAMPLE_RATIO``, ``GATEWAY_TRACE_TRUST_UPSTREAM``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from opentelemetry import propagate, trace
from opentelemetry.trace import NoOpTracerProvider, Span, SpanKind, Tracer, TracerProvider
from opentelemetry.util.types import AttributeValue

SERVICE_NAME = "clip-gateway"


@dataclass
class Telemetry:
    """The tracer provider of one app (SDK when exporting, no-op otherwise)."""

    provider: TracerProvider
    enabled: bool

    @property
    def tracer(self) -> Tracer:
        return self.provider.get_tracer("gateway")

    def shutdown(self) -> None:
        """Flush pending spans (the SDK provider has shutdown(); the no-op one has not)."""
        shutdown = getattr(self.provider, "shutdown", None)
        if shutdown is not None:
            shutdown()


def tracing_wanted(mode: str, environ: Mapping[str, str] = os.environ) -> bool:
    if mode != "auto":
        return mode == "on"
    if environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    return bool(
        environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


def create_telemetry(mode: str, ratio: float = 1.0, trust_upstream: bool = False) -> Telemetry:
    """The app's tracer provider. Sampling is decided here, at the edge: a fraction ``ratio`` of
    requests. An incoming traceparent keeps its trace id either way, and one marked not sampled
    is respected (less work); one marked sampled is obeyed only with ``trust_upstream`` —
    otherwise any client could make the server trace (and Triton trace) every request."""
    if not tracing_wanted(mode):
        return Telemetry(NoOpTracerProvider(), enabled=False)
    # Imported only when tracing is on: the SDK and exporter are not on the hot path otherwise.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import (
        ALWAYS_OFF,
        ALWAYS_ON,
        ParentBased,
        TraceIdRatioBased,
    )

    own = TraceIdRatioBased(ratio)
    sampler = ParentBased(
        root=own,
        remote_parent_sampled=ALWAYS_ON if trust_upstream else own,
        remote_parent_not_sampled=ALWAYS_OFF,
    )
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", SERVICE_NAME)})
    provider = SdkTracerProvider(resource=resource, sampler=sampler)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return Telemetry(provider, enabled=True)


def current_ids() -> tuple[str, str] | None:
    """(trace id, span id) of the current sampled span, for logs and exemplars."""
    context = trace.get_current_span().get_span_context()
    if not context.is_valid or not context.trace_flags.sampled:
        return None
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


def trace_headers() -> dict[str, str]:
    """W3C ``traceparent`` for the current span, only if sampled.

    Triton traces every request that carries a traceparent, whatever its sampled flag, so an
    unsampled context is not propagated (its Triton spans would hang off a parent that is never
    exported).
    """
    if current_ids() is None:
        return {}
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def record_span(
    tracer: Tracer,
    name: str,
    start_ns: int,
    end_ns: int,
    attributes: Mapping[str, AttributeValue] | None = None,
) -> None:
    """A child of the current span for an interval measured elsewhere (e.g. in worker threads)."""
    span = tracer.start_span(name, start_time=start_ns, attributes=attributes)
    span.end(end_time=max(end_ns, start_ns))


@contextmanager
def client_span(
    tracer: Tracer, name: str, attributes: Mapping[str, AttributeValue]
) -> Iterator[Span]:
    """A client span under the current request's span; none outside requests (the canary's
    periodic calls would otherwise each start a trace of their own)."""
    if not trace.get_current_span().get_span_context().is_valid:
        yield trace.INVALID_SPAN
        return
    with tracer.start_as_current_span(name, kind=SpanKind.CLIENT, attributes=attributes) as span:
        yield span
