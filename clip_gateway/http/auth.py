"""Optional API keys: Bearer tokens on every route but the probes, compared in constant time,
never logged."""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler

from clip_gateway.config.settings import load_api_keys
from clip_gateway.http.context import app_context
from clip_gateway.http.problems import Unauthorized

__all__ = ["PUBLIC", "key_of", "load_api_keys", "matches", "require_api_key"]

#: Route ``opt`` key: the route answers without a key (liveness and readiness probes).
PUBLIC = "public"


def matches(presented: bytes, keys: tuple[bytes, ...]) -> bool:
    """Compare against every key, without stopping early, so timing reveals nothing."""
    found = False
    for key in keys:
        found |= hmac.compare_digest(presented, key)
    return found


async def require_api_key(
    connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler
) -> None:
    """App-wide Litestar guard: with keys configured, every route but the probes (``PUBLIC``)
    needs one: the API, /metrics (request counts and timings) and /docs alike.

    A coroutine on purpose: Litestar runs a plain-function guard in a worker thread, which cost
    every request a thread hop (and the soak run saw the loop's default pool grow for it)."""
    keys: tuple[bytes, ...] = app_context(connection.app.state).api_keys
    if not keys or handler.opt.get(PUBLIC):
        return
    scheme, _sep, token = connection.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("this gateway needs an API key: send `Authorization: Bearer <key>`")
    if not matches(token.strip().encode(), keys):
        raise Unauthorized("API key not accepted")


def key_of(connection: ASGIConnection[Any, Any, Any, Any]) -> str | None:
    """Which API key a request was let in with, for admission's fair shares: a digest of it
    (never the key), or None when fewer than two keys are configured (no share to keep)."""
    keys: tuple[bytes, ...] = app_context(connection.app.state).api_keys
    if len(keys) < 2:
        return None
    _scheme, _sep, token = connection.headers.get("authorization", "").partition(" ")
    return hashlib.sha256(token.strip().encode()).hexdigest()[:16]
