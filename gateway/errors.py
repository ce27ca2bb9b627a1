"""The gateway's error hierarchy: each class carries its HTTP status and RFC 9457 type/title."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar

from litestar.plugins.problem_details import ProblemDetailsException

PROBLEM_BASE = "https://clip-gateway.dev/problems/"


class GatewayError(Exception):
    """Base of every error the gateway reports on purpose; rendered as application/problem+json."""

    status: ClassVar[int] = 500
    slug: ClassVar[str] = "internal"
    title: ClassVar[str] = "Internal error"
    #: Seconds a client should wait before retrying (adds a Retry-After header when set).
    retry_after: ClassVar[int | None] = None
    #: Extra response headers of this kind of error.
    headers: ClassVar[Mapping[str, str]] = MappingProxyType({})

    def __init__(self, detail: str, *, index: int | None = None, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.index = index
        self.extra = extra

    def to_problem(self) -> ProblemDetailsException:
        extra = dict(self.extra)
        if self.index is not None:
            extra["index"] = self.index
        headers = dict(self.headers)
        if self.retry_after is not None:
            headers["Retry-After"] = str(self.retry_after)
        return ProblemDetailsException(
            detail=self.detail,
            status_code=self.status,
            type_=PROBLEM_BASE + self.slug,
            title=self.title,
            extra=extra or None,
            headers=headers or None,
        )


class InvalidRequest(GatewayError):
    status, slug, title = 400, "invalid-request", "Invalid request"


class Unauthorized(GatewayError):
    status, slug, title = 401, "unauthorized", "Missing or invalid API key"
    headers = MappingProxyType({"WWW-Authenticate": 'Bearer realm="clip-gateway"'})


class RequestTimeout(GatewayError):
    """The body did not arrive in time (slow or stalled client)."""

    status, slug, title = 408, "request-timeout", "Request body too slow"


class UnknownModel(GatewayError):
    status, slug, title = 404, "unknown-model", "Unknown model"


class PayloadTooLarge(GatewayError):
    status, slug, title = 413, "payload-too-large", "Request too large"


class UnsupportedMediaType(GatewayError):
    status, slug, title = 415, "unsupported-media-type", "Unsupported media type"


class UnprocessableRequest(GatewayError):
    """Well-formed JSON that does not match the request schema."""

    status, slug, title = 422, "unprocessable-request", "Request does not match the schema"


class InvalidImage(GatewayError):
    """Bytes that are not a decodable image: empty, corrupt, truncated, or not an image at all."""

    status, slug, title = 422, "invalid-image", "Invalid image"


class ImageTooLarge(GatewayError):
    status, slug, title = 422, "image-too-large", "Image has too many pixels"


class Overloaded(GatewayError):
    status, slug, title, retry_after = 429, "overloaded", "Too many images in flight", 1


class ClientClosedRequest(GatewayError):
    """The client went away; its pending work was cancelled. Nobody reads this response."""

    status, slug, title = 499, "client-closed-request", "Client closed the request"


class DeadlineExceeded(GatewayError):
    status, slug, title = 504, "deadline-exceeded", "Request deadline exceeded"


class BackendUnavailable(GatewayError):
    status, slug, title, retry_after = (
        503,
        "backend-unavailable",
        "Inference backend unavailable",
        2,
    )


class BackendTimeout(GatewayError):
    status, slug, title = 504, "backend-timeout", "Inference backend timed out"


class BackendError(GatewayError):
    status, slug, title = 502, "backend-error", "Inference backend failed"
