"""Per-request observation: one JSON log line and the request metrics (with trace exemplars)."""

from __future__ import annotations

import logging
import time
from typing import Any

from litestar.enums import ScopeType
from litestar.middleware import ASGIMiddleware
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from clip_gateway.observability.metrics import Metrics, multiprocess_dir
from clip_gateway.observability.tracing import current_ids

access_log = logging.getLogger("gateway.access")


class ObserveMiddleware(ASGIMiddleware):
    """Runs inside the tracing middleware, so the server span is current here."""

    scopes = (ScopeType.HTTP,)

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.exemplars = multiprocess_dir() is None  # the multiprocess files cannot hold them

    async def handle(self, scope: Scope, receive: Receive, send: Send, next_app: ASGIApp) -> None:
        started = time.perf_counter()
        status = 500

        async def capture(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                if ids := current_ids():  # W3C traceresponse: where to find this request's trace
                    headers = [*message.get("headers", ())]
                    headers.append((b"traceresponse", f"00-{ids[0]}-{ids[1]}-01".encode()))
                    message = {**message, "headers": headers}
            await send(message)

        try:
            await next_app(scope, receive, capture)
        finally:
            self._record(scope, status, time.perf_counter() - started)

    def _record(self, scope: Scope, status: int, seconds: float) -> None:
        route = str(scope.get("path_template") or "unmatched")
        method = str(scope.get("method", ""))
        ids = current_ids()
        labels = {"route": route, "method": method, "status": str(status)}
        self.metrics.requests.labels(**labels).inc()
        exemplar = {"trace_id": ids[0]} if ids and self.exemplars else None
        self.metrics.request_seconds.labels(**labels).observe(seconds, exemplar)
        state: dict[str, Any] = scope.get("state", {})
        access_log.info(
            "%s %s %d",
            method,
            route,
            status,
            extra={
                "route": route,
                "method": method,
                "status": status,
                "images": state.get("images"),
                "texts": state.get("texts"),
                "duration_ms": round(seconds * 1000, 2),
                "trace_id": ids[0] if ids else None,
                "span_id": ids[1] if ids else None,
            },
        )
