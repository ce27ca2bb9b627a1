"""The gateway's error hierarchy: each class carries its HTTP status and RFC 9457 type/title."""

from __future__ import annotations

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

    def __init__(self, detail: str, *, index: int | None = None, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.index = index
        self.extra = extra

    def to_problem(self) -> ProblemDetailsException:
        extra = dict(self.extra)
        if self.index is not None:
            extra["index"] = self.index
        headers = {"Retry-After": str(self.retry_after)} if self.retry_after is not None else None
        return ProblemDetailsException(
            detail=self.detail,
            status_code=self.status,
            type_=PROBLEM_BASE + self.slug,
            title=self.title,
            extra=extra or None,
            headers=headers,
        )


class InvalidRequest(GatewayError):
    status, slug, title = 400, "invalid-request", "Invalid request"


class Unauthorized(GatewayError):
    status, slug, title = 401, "unauthorized", "Missing or invalid API key"


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
