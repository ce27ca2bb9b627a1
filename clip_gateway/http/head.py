"""HEAD on every GET route (RFC 9110 section 9.3.2): answered as the GET would be, without the
body. Litestar routes HEAD only to handlers declared for it, so the request is routed as a GET
and the body is dropped on the way out (headers, Content-Length included, are the GET's)."""

from __future__ import annotations

from typing import Any

from litestar.types import ASGIApp, Message, Receive, Scope, Send


def as_get(app: ASGIApp) -> ASGIApp:
    async def handle(scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("method") != "HEAD":  # HTTP only: other scopes have no method
            await app(scope, receive, send)
            return

        async def without_body(message: Message) -> None:
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        routed: Any = {**scope, "method": "GET"}
        await app(routed, receive, without_body)

    return handle
