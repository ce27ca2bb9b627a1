"""The one map from error kinds to HTTP: status, RFC 9457 type and title, headers.

Looked up along the class hierarchy, so a subclass inherits its parent's row unless it has one.
Routes never catch anything; Litestar's exception handlers call ``respond`` (ours) or render its
own HTTP errors the same way. A 500 never carries the exception's text.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from litestar import Request, Response
from litestar.exceptions import HTTPException

from clip_gateway import errors
from clip_gateway.http.context import app_context

log = logging.getLogger("gateway")

PROBLEM_BASE = "https://clip-gateway.dev/problems/"
PROBLEM_MEDIA_TYPE = "application/problem+json"


class Unauthorized(errors.EmbeddingError):
    """No API key, or one that is not accepted (an edge concern: the pipeline never sees it)."""


@dataclass(frozen=True)
class ProblemKind:
    status: int
    slug: str
    title: str

    @property
    def type(self) -> str:
        return PROBLEM_BASE + self.slug


PROBLEMS: dict[type[Exception], ProblemKind] = {
    errors.MalformedRequest: ProblemKind(400, "invalid-request", "Invalid request"),
    errors.ModalityUnavailable: ProblemKind(400, "modality-unavailable", "Modality not served"),
    Unauthorized: ProblemKind(401, "unauthorized", "Missing or invalid API key"),
    errors.UnknownModel: ProblemKind(404, "unknown-model", "Unknown model"),
    errors.BodyTooSlow: ProblemKind(408, "request-timeout", "Request body too slow"),
    errors.OtherModel: ProblemKind(409, "other-model", "Another model is served here"),
    errors.LimitExceeded: ProblemKind(413, "payload-too-large", "Request too large"),
    errors.UnsupportedFormat: ProblemKind(415, "unsupported-media-type", "Unsupported media type"),
    errors.InvalidFields: ProblemKind(
        422, "unprocessable-request", "Request does not match the schema"
    ),
    errors.InvalidImage: ProblemKind(422, "invalid-image", "Invalid image"),
    errors.InvalidText: ProblemKind(422, "invalid-text", "Invalid text"),
    errors.UrlRefused: ProblemKind(422, "url-refused", "URL refused by the fetch guard"),
    errors.UrlFailed: ProblemKind(422, "url-fetch-failed", "URL fetch gave no image"),
    errors.ImageTooLarge: ProblemKind(422, "image-too-large", "Image too large to decode"),
    errors.Overloaded: ProblemKind(429, "overloaded", "Too much work in flight"),
    errors.Overspent: ProblemKind(429, "decode-overspent", "Decode work over its admitted price"),
    errors.ClientGone: ProblemKind(499, "client-closed-request", "Client closed the request"),
    errors.UnsupportedTask: ProblemKind(501, "unsupported-task", "Task not served here"),
    errors.BackendFailed: ProblemKind(502, "backend-error", "Inference backend failed"),
    errors.BackendUnavailable: ProblemKind(
        503, "backend-unavailable", "Inference backend unavailable"
    ),
    errors.BackendTimeout: ProblemKind(504, "backend-timeout", "Inference backend timed out"),
    errors.UpstreamFailed: ProblemKind(502, "upstream-error", "Immich's ML server failed"),
    errors.UpstreamUnavailable: ProblemKind(
        503, "upstream-unavailable", "Immich's ML server unavailable"
    ),
    errors.UpstreamBusy: ProblemKind(503, "upstream-busy", "Too many forwards in flight"),
    errors.UpstreamTimeout: ProblemKind(504, "upstream-timeout", "Immich's ML server timed out"),
    errors.DeadlineExceeded: ProblemKind(504, "deadline-exceeded", "Request deadline exceeded"),
    errors.EmbeddingError: ProblemKind(500, "internal", "Internal error"),
}
#: Litestar's own HTTP errors (body too large, bad query parameter, ...): their reason slugs.
HTTP_SLUGS = {
    400: "invalid-request",
    404: "not-found",
    405: "method-not-allowed",
    413: "payload-too-large",
}
#: Statuses whose answer says when to try again.
RETRY_STATUSES = frozenset({429, 503})
#: The gRPC channel's longest reconnect backoff: a 503 for an unreachable Triton is not worth
#: retrying sooner (clip_gateway/backend/triton.py).
RECONNECT_S = 2.0


def problem_of(exc: errors.EmbeddingError) -> ProblemKind:
    for kind in type(exc).__mro__:
        if kind in PROBLEMS:
            return PROBLEMS[kind]
    raise LookupError(type(exc))  # unreachable: EmbeddingError has a row


def document(exc: errors.EmbeddingError) -> dict[str, Any]:
    """The RFC 9457 body: type, title, status, detail, the item's index and extra facts."""
    problem = problem_of(exc)
    body: dict[str, Any] = {
        "type": problem.type,
        "title": problem.title,
        "status": problem.status,
        "detail": exc.reason,
    }
    if exc.index is not None:
        body["index"] = exc.index
    body.update(exc.extra)
    return body


def headers_of(exc: errors.EmbeddingError, backlog_s: float = 0.0) -> dict[str, str]:
    """Headers of the problem answer. Every 429 and 503 says when to retry: the wait the error
    computed, else (Triton unavailable or shedding) the seconds this worker's admitted work
    needs to drain, at least the channel's reconnect backoff."""
    problem = problem_of(exc)
    headers: dict[str, str] = {}
    wait = exc.retry_after
    if wait is None and problem.status in RETRY_STATUSES:
        wait = max(RECONNECT_S, backlog_s)
    if wait is not None:
        headers["Retry-After"] = str(max(1, math.ceil(wait)))  # delta-seconds: an integer
    if isinstance(exc, Unauthorized):
        headers["WWW-Authenticate"] = 'Bearer realm="clip-gateway"'
    if isinstance(exc, errors.BodyTooSlow):
        headers["Connection"] = "close"  # the rest of a stalled body is not waited for
    return headers


def released(exc: BaseException) -> None:
    """Drop the tracebacks of an answered failure and of the failures chained to it.

    A traceback holds every frame the failure passed through, and those frames hold the
    request's items and the failure itself (``raise errors[0]`` with the list in a local, an
    asyncio task that stored the failure): reference cycles that only a full collection frees,
    which may not come for minutes, so a few failed uploads of tens of MB stayed in memory
    (docs/RELIABILITY.md). Once the answer is built nothing needs them; logging comes first."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        failure = pending.pop()
        if failure is None or id(failure) in seen:
            continue
        seen.add(id(failure))
        failure.__traceback__ = None
        pending += [failure.__cause__, failure.__context__]
        if isinstance(failure, BaseExceptionGroup):
            pending += failure.exceptions


def respond(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """Litestar exception handler for our errors and Litestar's HTTP errors; counted by reason."""
    released(exc)
    if isinstance(exc, errors.EmbeddingError):
        service = getattr(request.app.state, "service", None)
        backlog = service.admission.backlog_s if service is not None else 0.0
        body, headers, slug = document(exc), headers_of(exc, backlog), problem_of(exc).slug
    else:
        assert isinstance(exc, HTTPException)
        slug = HTTP_SLUGS.get(exc.status_code, f"http-{exc.status_code}")
        body = {
            "type": PROBLEM_BASE + slug,
            "title": _reason_phrase(exc.status_code),
            "status": exc.status_code,
            "detail": exc.detail,
            **(exc.extra if isinstance(exc.extra, dict) else {}),
        }
        headers = dict(exc.headers or {})
    app_context(request.app.state).metrics.rejected.labels(slug).inc()
    return Response(
        body, status_code=body["status"], headers=headers, media_type=PROBLEM_MEDIA_TYPE
    )


def internal_error(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """Anything not raised on purpose: log it, answer 500 without leaking its text."""
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    released(exc)
    app_context(request.app.state).metrics.rejected.labels("internal").inc()
    return Response(
        {"type": "about:blank", "title": "Internal Server Error", "status": 500},
        status_code=500,
        media_type=PROBLEM_MEDIA_TYPE,
    )


def _reason_phrase(status: int) -> str:
    from http import HTTPStatus

    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"
