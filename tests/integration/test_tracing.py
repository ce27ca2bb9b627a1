"""One trace from the HTTP request into Triton: gateway and Triton spans in a real OTLP receiver.

The receiver is oteltest's OTLP/HTTP sink (JSON and protobuf; Triton 2.51 exports JSON). Triton
is started with OpenTelemetry tracing at rate 0, so it traces exactly the requests that arrive
with the gateway's traceparent. The bundled Triton 2.51's tracer crashes the server under traced
load (triton-inference-server/server#7795), so the gateway sends it no traceparent unless told
(``GATEWAY_TRITON_SPANS=on``, as here: a few requests at a time) and by default only to 2.57+.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from oteltest.sink import HttpSink
from oteltest.sink.handler import RequestHandler

from clip_gateway.config.processes import GatewayProcess, reserve_port
from clip_gateway.launcher.local import LocalTriton, otel_trace_args
from tests import samples
from tests.metrics import sample, sample_or_zero


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    attributes: dict[str, object]


class Collector(RequestHandler):
    """Keeps every span the sink receives, with the service that sent it and the content type."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.content_types: set[str] = set()
        self.lock = threading.Lock()

    def handle_trace(self, request, headers) -> None:
        content_type = next((v for k, v in headers.items() if k.lower() == "content-type"), "")
        # OTLP/JSON carries ids as hex strings (the spec, and what Triton sends); oteltest parses
        # JSON with protobuf's generic mapping, which reads bytes fields as base64. Undo that.
        ident = _json_id if "json" in content_type else bytes.hex
        with self.lock:
            self.content_types.add(content_type)
            for resource_spans in request.resource_spans:
                service = next(
                    (
                        a.value.string_value
                        for a in resource_spans.resource.attributes
                        if a.key == "service.name"
                    ),
                    "",
                )
                for scope_spans in resource_spans.scope_spans:
                    for s in scope_spans.spans:
                        attributes = {a.key: _value(a.value) for a in s.attributes}
                        self.spans.append(
                            Span(service, s.name, ident(s.trace_id), ident(s.span_id),
                                 ident(s.parent_span_id), s.kind, attributes)
                        )  # fmt: skip

    def handle_metrics(self, request, headers) -> None:
        pass

    def handle_logs(self, request, headers) -> None:
        pass

    def trace(self, trace_id: str) -> list[Span]:
        with self.lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def wait_for(self, trace_id: str, names: set[str], timeout: float = 20.0) -> list[Span]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            spans = self.trace(trace_id)
            if names <= {s.name for s in spans}:
                return spans
            time.sleep(0.1)
        with self.lock:
            triton = [(s.trace_id, s.name) for s in self.spans if s.service == "triton"]
        raise AssertionError(
            f"missing {names - {s.name for s in self.trace(trace_id)}} in trace {trace_id}; "
            f"content types {self.content_types}; triton spans seen: {triton[-12:]}"
        )


def _json_id(raw: bytes) -> str:
    return base64.b64encode(raw).decode() if raw else ""


def _value(value) -> object:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


@dataclass
class TracedStack:
    collector: Collector
    gateway: GatewayProcess
    #: what a second gateway on the same Triton needs: its environment and Triton's address
    env: dict[str, str]
    triton_url: str


@pytest.fixture(scope="module")
def traced(cpu_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TracedStack]:
    collector = Collector()
    reserved = reserve_port()
    port = reserved.port
    sink = HttpSink(collector, logging.getLogger("otlp-sink"), port=port)
    sink.start()
    endpoint = f"http://127.0.0.1:{port}"
    logs = tmp_path_factory.mktemp("traced")
    # 1 s export delay: Triton 2.51's exporter loses whole exports when they are frequent
    trace_args = otel_trace_args(f"{endpoint}/v1/traces", flush_ms=1000)
    try:
        with LocalTriton(
            cpu_repository, log_path=logs / "triton.log", extra_args=trace_args
        ) as triton:
            env = {
                "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
                "OTEL_BSP_SCHEDULE_DELAY": "200",
                "GATEWAY_TRITON_METRICS_URL": triton.metrics_url,
                "GATEWAY_DECODE_THREADS": "2",
            }
            spans_on = {**env, "GATEWAY_TRITON_SPANS": "on"}
            with GatewayProcess(
                triton.grpc_url,
                env=spans_on,
                log_path=logs / "gateway.log",
                triton_http_url=triton.http_url,  # the inference calls as the launcher makes them
            ) as gateway:
                gateway.wait_ready()
                yield TracedStack(collector, gateway, env, triton.grpc_url)
    finally:
        sink.stop()
        reserved.release()


def embed(stack: TracedStack, headers: dict[str, str], images: int = 2) -> httpx.Response:
    files = [("image", (f"{i}.jpg", samples.compact(i), "image/jpeg")) for i in range(images)]
    response = httpx.post(
        f"{stack.gateway.url}/v1/embeddings", files=files, headers=headers, timeout=60
    )
    assert response.status_code == 200, response.text[:300]
    return response


def by_name(spans: list[Span], name: str) -> Span:
    (span,) = [s for s in spans if s.name == name]
    return span


def first_complete(collector: Collector, trace_ids: list[str], timeout: float = 20.0) -> list[Span]:
    """The first of ``trace_ids`` whose gateway and Triton spans have all arrived.

    Triton 2.51 drops part of its own span exports (measured with plain tritonclient calls, no
    gateway involved: 36 of 40 traces at 50 ms intervals with a 200 ms export delay, 39-40 of 40
    with the default 5 s delay), so the test sends several traced requests and checks the
    structure on the first one delivered whole; the gateway's spans must arrive for every one.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for trace_id in trace_ids:
            names = {s.name for s in collector.trace(trace_id)}
            if names >= GATEWAY_SPANS | TRITON_SPANS:
                return collector.trace(trace_id)
        time.sleep(0.1)
    raise AssertionError(f"no trace delivered whole: {[collector.trace(t) for t in trace_ids]}")


GATEWAY_SPANS = {"POST /v1/embeddings", "receive", "preprocess", "pool.wait", "decode",
                 "triton.infer", "encode"}  # fmt: skip
TRITON_SPANS = {"InferRequest", "clip_image", "compute"}


def test_one_trace_from_http_request_into_triton(traced: TracedStack) -> None:
    client_span = "00f067aa0ba902b7"
    trace_ids = [f"4bf92f3577b34da6a3ce929d0e0e47{i:02x}" for i in range(4)]
    for trace_id in trace_ids:
        embed(traced, {"traceparent": f"00-{trace_id}-{client_span}-01"})
    for trace_id in trace_ids:  # the gateway's own spans arrive for every request
        traced.collector.wait_for(trace_id, GATEWAY_SPANS)
    spans = first_complete(traced.collector, trace_ids)
    server = by_name(spans, "POST /v1/embeddings")
    assert (server.service, server.parent_id) == ("clip-gateway", client_span)
    for child in ("receive", "preprocess", "triton.infer", "encode"):
        assert by_name(spans, child).parent_id == server.span_id, child
    preprocess = by_name(spans, "preprocess")
    assert by_name(spans, "pool.wait").parent_id == preprocess.span_id
    assert by_name(spans, "decode").parent_id == preprocess.span_id
    assert preprocess.attributes["images"] == 2
    assert preprocess.attributes["image.bytes"] == len(samples.compact(0)) + len(samples.compact(1))
    call = by_name(spans, "triton.infer")
    assert call.attributes["triton.batch_size"] == 2
    assert call.attributes["triton.status_code"] == "OK"
    assert call.attributes["http.request.method"] == "POST"
    # Triton's own spans hang off the call's span: one tree.
    infer_request = by_name(spans, "InferRequest")
    assert (infer_request.service, infer_request.parent_id) == ("triton", call.span_id)
    assert by_name(spans, "clip_image").parent_id == infer_request.span_id
    assert by_name(spans, "compute").parent_id == by_name(spans, "clip_image").span_id
    delivered = sum(1 for t in trace_ids if traced.collector.trace(t) and
                    {s.name for s in traced.collector.trace(t)} >= TRITON_SPANS)  # fmt: skip
    print(f"\nTriton spans delivered for {delivered} of {len(trace_ids)} traced requests")
    for span in sorted(spans, key=lambda s: (s.service, s.name)):
        print(f"  {span.service:13s} {span.name:22s} span={span.span_id} parent={span.parent_id}")


def test_every_triton_span_hangs_off_a_gateway_call(traced: TracedStack) -> None:
    """No orphans: whatever Triton delivers is parented under the gateway's triton.infer span."""
    trace_ids = [f"5555555555555555555555555555aa{i:02x}" for i in range(4)]
    for trace_id in trace_ids:
        embed(traced, {"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"})
    # Triton drops some of its exports: wait until at least one of these traces is whole
    first_complete(traced.collector, trace_ids)
    for trace_id in trace_ids:
        traced.collector.wait_for(trace_id, {"triton.infer"})
        spans = traced.collector.trace(trace_id)
        calls = {s.span_id for s in spans if s.name == "triton.infer"}
        roots = [s for s in spans if s.name == "InferRequest"]
        assert all(s.parent_id in calls for s in roots), (trace_id, roots, calls)


def test_new_trace_when_the_client_sends_none(traced: TracedStack) -> None:
    trace_ids = []
    for _ in range(3):
        version, trace_id, span_id, flags = embed(traced, {}).headers["traceresponse"].split("-")
        assert (version, flags, len(span_id)) == ("00", "01", 16)
        trace_ids.append(trace_id)
    assert len(set(trace_ids)) == 3
    spans = first_complete(traced.collector, trace_ids)
    assert by_name(spans, "POST /v1/embeddings").parent_id == ""


def test_unsampled_requests_leave_no_spans_anywhere(traced: TracedStack) -> None:
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    embed(traced, {"traceparent": f"00-{trace_id}-b7ad6b7169203331-00"}, images=1)
    # Both exporters send spans in the order they ended: once Triton's spans of a sampled
    # request sent *after* it have arrived, anything of the unsampled one would have too.
    later = [f"1111111111111111111111111111{i:04x}" for i in range(4)]
    for sampled in later:
        embed(traced, {"traceparent": f"00-{sampled}-b7ad6b7169203331-01"}, images=1)
    first_complete(traced.collector, later)
    assert traced.collector.trace(trace_id) == []


def test_an_unfixed_triton_gets_no_trace_context_by_default(
    traced: TracedStack, tmp_path: Path
) -> None:
    """``auto`` on Triton 2.51: every gateway span, no Triton span, and the log says why."""
    log = tmp_path / "gateway.log"
    with GatewayProcess(traced.triton_url, env=traced.env, log_path=log) as plain:
        plain.wait_ready()
        stack = TracedStack(traced.collector, plain, traced.env, traced.triton_url)
        quiet = [f"6666666666666666666666666666{i:04x}" for i in range(4)]
        for trace_id in quiet:
            embed(stack, {"traceparent": f"00-{trace_id}-b7ad6b7169203331-01"}, images=1)
        for trace_id in quiet:
            traced.collector.wait_for(trace_id, GATEWAY_SPANS)
    # Triton exports its spans in the order they ended: once those of requests sent after
    # these (through the gateway that sends the context) have arrived, any of these would have
    later = [f"7777777777777777777777777777{i:04x}" for i in range(4)]
    for trace_id in later:
        embed(traced, {"traceparent": f"00-{trace_id}-b7ad6b7169203331-01"}, images=1)
    first_complete(traced.collector, later)
    for trace_id in quiet:
        assert not [s for s in traced.collector.trace(trace_id) if s.service == "triton"]
    assert "triton-inference-server/server#7795" in log.read_text()
    assert "triton-inference-server/server#7795" not in traced.gateway.log_path.read_text()


def test_triton_exports_otlp_json(traced: TracedStack) -> None:
    """Why the receiver must accept JSON (arize-phoenix accepts only protobuf). Its own sampled
    requests, so it holds in any order and alone."""
    sent = [f"3333333333333333333333333333{i:04x}" for i in range(4)]
    for trace_id in sent:
        embed(traced, {"traceparent": f"00-{trace_id}-b7ad6b7169203331-01"}, images=1)
    first_complete(traced.collector, sent)  # both exporters have delivered
    assert any("application/json" in c for c in traced.collector.content_types)
    assert any("protobuf" in c for c in traced.collector.content_types)  # the Python SDK's


def test_one_request_moves_every_metric_by_its_amount(traced: TracedStack) -> None:
    url = traced.gateway.url
    request = {"route": "/v1/embeddings", "method": "POST", "status": "200"}
    triton_ok = {"model": "clip_image", "version": "1"}
    counts = [
        ("gateway_requests_total", request, 1),
        ("gateway_request_duration_seconds_count", request, 1),
        ("gateway_images_total", {"format": "jpeg"}, 3),
        ("gateway_image_decode_seconds_count", {"format": "jpeg"}, 3),
        ("gateway_triton_request_duration_seconds_count", {"model": "image", "outcome": "ok"}, 1),
        ("gateway_triton_batch_size_count", {"model": "image"}, 1),
        ("gateway_triton_batch_size_sum", {"model": "image"}, 3),
    ]

    def read() -> tuple[list[float], float]:
        text = httpx.get(f"{url}/metrics").text
        triton = httpx.get(f"{url}/metrics/triton").text
        values = [sample_or_zero(text, name, **labels) for name, labels, _ in counts]
        return values, sample(triton, "nv_inference_request_success_total", **triton_ok)

    before, triton_before = read()
    embed(traced, {}, images=3)
    after, triton_after = read()
    deltas = {name: b - a for (name, _, _), a, b in zip(counts, before, after, strict=True)}
    assert deltas == {name: float(amount) for name, _, amount in counts}
    assert triton_after - triton_before >= 1  # Triton's own counters, re-exposed
    assert sample(httpx.get(f"{url}/metrics").text, "gateway_inflight_items") == 0
    openmetrics = httpx.get(
        f"{url}/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
    )
    assert openmetrics.headers["content-type"].startswith("application/openmetrics-text")
    assert '# {trace_id="' in openmetrics.text


def test_rejections_are_counted_by_reason(traced: TracedStack) -> None:
    url = traced.gateway.url
    name = "gateway_rejected_requests_total"
    before = sample_or_zero(httpx.get(f"{url}/metrics").text, name, reason="invalid-image")
    bad = httpx.post(f"{url}/v1/embeddings", files=[("image", ("x", b"", "image/jpeg"))])
    assert bad.status_code == 422
    after = sample(httpx.get(f"{url}/metrics").text, name, reason="invalid-image")
    assert after - before == 1


def test_access_log_is_one_json_line_per_request(traced: TracedStack) -> None:
    response = embed(
        traced, {"traceparent": "00-22222222222222222222222222222222-00f067aa0ba902b7-01"}
    )
    assert response.status_code == 200
    line = _access_log(traced.gateway, "22222222222222222222222222222222")
    assert line["route"] == "/v1/embeddings"
    assert (line["status"], line["images"], line["method"]) == (200, 2, "POST")
    assert line["trace_id"] == "22222222222222222222222222222222"
    assert line["duration_ms"] > 0
    text = traced.gateway.log_path.read_text()
    assert "base64" not in text and "\\xff\\xd8" not in text  # no image bytes in logs


def _access_log(gateway: GatewayProcess, trace_id: str) -> dict:
    """The access-log line of the request with ``trace_id`` (lines are written asynchronously)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        for line in gateway.log_path.read_text().splitlines():
            if line.startswith("{") and trace_id in line:
                record = json.loads(line)
                if record.get("logger") == "gateway.access":
                    return record
        time.sleep(0.05)
    raise AssertionError(f"no access log line for trace {trace_id}")
