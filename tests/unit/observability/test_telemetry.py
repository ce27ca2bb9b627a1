"""Tracing switches, trace propagation rules, metrics exposition and log configuration."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from litestar.testing import TestClient
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from prometheus_client.parser import text_string_to_metric_families

from clip_gateway.config.settings import ServerSettings
from clip_gateway.http.app import create_app
from clip_gateway.http.context import app_context
from clip_gateway.launcher.local import otel_trace_args, otlp_traces_url
from clip_gateway.observability import tracing as telemetry
from clip_gateway.observability.logs import logging_config
from clip_gateway.observability.metrics import Metrics
from tests.fakes import FakeBackend


@pytest.mark.parametrize(
    ("mode", "env", "wanted"),
    [
        ("auto", {}, False),
        ("auto", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, True),
        ("auto", {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True),
        ("auto", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_SDK_DISABLED": "true"}, False),
        ("on", {}, True),
        ("off", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
    ],
)
def test_tracing_switch(mode: str, env: dict[str, str], wanted: bool) -> None:
    assert telemetry.tracing_wanted(mode, env) is wanted


def test_off_means_no_tracing_middleware_at_all(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    app = create_app(ServerSettings(), lambda *_: FakeBackend())
    assert "ServerSpans" not in _middleware_names(app)
    with TestClient(app):
        assert app_context(app.state).telemetry.enabled is False
    traced = create_app(ServerSettings(tracing="on"), lambda *_: FakeBackend())
    assert "ServerSpans" in _middleware_names(traced)  # what "off" leaves out


def _middleware_names(app: Any) -> list[str]:
    return [getattr(m, "middleware", type(m)).__name__ for m in app.middleware]


def test_traceparent_is_propagated_only_when_sampled() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("t").start_as_current_span("call") as span:
        headers = telemetry.trace_headers()
        ids = telemetry.current_ids()
    context = span.get_span_context()
    version, trace_id, span_id, flags = headers["traceparent"].split("-")
    assert (version, trace_id, span_id) == (
        "00",
        f"{context.trace_id:032x}",
        f"{context.span_id:016x}",
    )
    assert int(flags, 16) & 1  # sampled (newer SDKs also set the random-trace-id bit)
    assert ids == (f"{context.trace_id:032x}", f"{context.span_id:016x}")
    unsampled = TracerProvider(sampler=ALWAYS_OFF)
    with unsampled.get_tracer("t").start_as_current_span("call"):
        assert telemetry.trace_headers() == {}
        assert telemetry.current_ids() is None
    assert telemetry.trace_headers() == {}  # no span at all


def test_record_span_places_an_interval_under_the_current_span() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("parent") as parent:
        telemetry.record_span(tracer, "work", 1_000, 5_000, {"n": 3})
    work = next(s for s in exporter.get_finished_spans() if s.name == "work")
    assert (work.start_time, work.end_time, work.attributes["n"]) == (1_000, 5_000, 3)
    assert work.parent is not None and work.parent.span_id == parent.get_span_context().span_id


def test_triton_trace_flags() -> None:
    args = otel_trace_args("http://c:4318/v1/traces", rate=0, flush_ms=100)
    pairs = list(args)
    assert pairs[::2] == ["--trace-config"] * 6
    assert set(pairs[1::2]) == {
        "mode=opentelemetry", "rate=0", "level=TIMESTAMPS",
        "opentelemetry,url=http://c:4318/v1/traces",
        "opentelemetry,resource=service.name=triton",
        "opentelemetry,bsp_schedule_delay=100",
    }  # fmt: skip
    assert (
        otlp_traces_url({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"})
        == "http://c:4318/v1/traces"
    )
    assert otlp_traces_url({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://x/t"}) == "http://x/t"
    assert otlp_traces_url({}) is None
    # an uninterpolated compose variable (podman-compose 1.0.3) is no URL: tritonserver aborted
    # on the first sampled request when given one
    assert (
        otlp_traces_url({"OTEL_EXPORTER_OTLP_ENDPOINT": "${OTEL_EXPORTER_OTLP_ENDPOINT:-}"}) is None
    )
    assert otlp_traces_url({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "collector:4318"}) is None


def test_metrics_exposition_and_exemplars() -> None:
    metrics = Metrics()
    metrics.request_seconds.labels("/v1/embeddings", "POST", "200").observe(
        0.2, {"trace_id": "ab" * 16}
    )
    metrics.triton_batch.labels("image").observe(32)
    metrics.inflight.set(5)
    text, content_type = metrics.render(openmetrics_format=False)
    assert content_type.startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(text.decode())}
    assert families["gateway_inflight_items"].samples[0].value == 5
    assert "gateway_triton_batch_size" in families
    om, om_type = metrics.render(openmetrics_format=True)
    assert om_type.startswith("application/openmetrics-text")
    assert f'# {{trace_id="{"ab" * 16}"}} 0.2' in om.decode()


def test_json_logs_carry_extras(capsys: pytest.CaptureFixture[str]) -> None:
    logging.config.dictConfig(logging_config("INFO", "json"))
    try:
        logging.getLogger("gateway.access").info("POST /v1/embeddings 200", extra={"images": 3})
        line = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    finally:
        logging.config.dictConfig(logging_config("WARNING", "text"))
    assert (line["logger"], line["level"], line["images"]) == ("gateway.access", "INFO", 3)
    assert "timestamp" in line


@pytest.mark.parametrize(
    ("mode", "url", "regions"),
    [
        ("auto", "127.0.0.1:8001", 8),
        ("auto", "localhost:8001", 8),
        ("auto", "[::1]:8001", 8),
        ("auto", "triton.internal:8001", 0),
        ("off", "127.0.0.1:8001", 0),
        ("on", "triton.internal:8001", 8),
    ],
)
def test_shared_memory_only_where_triton_shares_the_host(mode: str, url: str, regions: int) -> None:
    settings = ServerSettings(triton_shared_memory=mode, triton_url=url)
    assert settings.shared_memory_regions == regions


def _decision(ratio: float, trust: bool, flags: str) -> bool:
    """Does the gateway sample a request arriving with a traceparent carrying ``flags``?"""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    provider = telemetry.create_telemetry("on", ratio, trust).provider
    try:
        parent = TraceContextTextMapPropagator().extract(
            {"traceparent": f"00-{'ab' * 16}-{'cd' * 8}-{flags}"}
        )
        span = provider.get_tracer("t").start_span("request", context=parent)
        sampled = span.get_span_context().trace_flags.sampled
        assert span.get_span_context().trace_id == int("ab" * 16, 16)  # same trace either way
        span.end()
        return bool(sampled)
    finally:
        provider.shutdown()  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("ratio", "trust", "flags", "sampled"),
    [
        (0.0, False, "01", False),  # a client cannot force tracing
        (0.0, True, "01", True),  # unless the operator trusts upstream sampling
        (1.0, False, "01", True),
        (1.0, False, "00", False),  # a "not sampled" upstream is always respected
        (1.0, True, "00", False),
    ],
)
def test_sampling_is_decided_at_the_edge(
    monkeypatch: pytest.MonkeyPatch, ratio: float, trust: bool, flags: str, sampled: bool
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")  # never reached
    # a sampled span is exported at shutdown: refused, the exporter retried it for ~7 s
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "0.1")
    assert _decision(ratio, trust, flags) is sampled


def test_a_dead_workers_live_gauges_are_forgotten_and_its_counters_kept(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess
    import sys

    from clip_gateway.backend.shm import alive
    from clip_gateway.observability.metrics import Metrics, forget_dead_workers

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    # a worker that counted a request and held 7 images in flight, then died without stopping
    script = (
        "from clip_gateway.observability.metrics import Metrics; m = Metrics(); "
        "m.inflight.inc(7); m.images.labels('jpeg').inc(3); import os; print(os.getpid())"
    )
    dead = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True)
    dead_pid = int(dead.stdout)
    # a live worker holding 2 images: it says so, then waits for its stdin to close
    live = subprocess.Popen(
        [sys.executable, "-c", "from clip_gateway.observability.metrics import Metrics; "
         "Metrics().inflight.inc(2); print('held', flush=True); input()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert live.stdout is not None and live.stdout.readline() == "held\n"
        before = Metrics().render(False)[0].decode()
        assert "gateway_inflight_items 9.0" in before
        forgotten = forget_dead_workers(str(tmp_path), alive)
        assert forgotten == [dead_pid] and live.pid not in forgotten
        after = Metrics().render(False)[0].decode()
    finally:
        live.communicate("\n", timeout=30)
    assert "gateway_inflight_items 2.0" in after  # the live worker's images, not the dead one's
    assert 'gateway_images_total{format="jpeg"} 3.0' in after
