"""What can go wrong while embedding, in the core's own terms (imaging, pipeline, backend, and
the edge's bodies, URL fetches and Immich's upstream): no HTTP.

Each kind carries a human reason, the index of the item at fault (when one is) and extra facts
(limits, counts). ``clip_gateway/http/problems.py`` is the one place that turns them into statuses.
"""

from __future__ import annotations

from typing import Any


class EmbeddingError(Exception):
    """Base of every error raised on purpose while serving a request."""

    def __init__(
        self,
        reason: str,
        *,
        index: int | None = None,
        retry_after: float | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        #: The request position of the item at fault (images and texts alike).
        self.index = index
        #: Seconds after which trying again may succeed (overload, a backend restarting).
        self.retry_after = retry_after
        self.extra = extra


class MalformedRequest(EmbeddingError):
    """The body cannot be read: broken JSON or multipart, an option with a bad value, no items."""


class InvalidFields(EmbeddingError):
    """Well-formed JSON whose fields do not match the request schema."""


class UnknownModel(EmbeddingError):
    """The request names a model this gateway does not serve."""


class OtherModel(UnknownModel):
    """Immich's ``/predict`` names a model this gateway does not serve: its server must try its
    next URL rather than mix another model's vectors into the index."""


class UnsupportedTask(EmbeddingError):
    """Immich's ``/predict`` asks for a task other than one CLIP encoding (faces, OCR, several
    at once): the full Immich ML server behind this one in Immich's URL list does them."""


class LimitExceeded(EmbeddingError):
    """A size limit: the body, one item's bytes, the number of items."""


class UnsupportedFormat(EmbeddingError):
    """Known, but not accepted: a request content type or an image format."""


class InvalidImage(EmbeddingError):
    """Bytes that are not a decodable image: empty, corrupt, truncated, or not an image."""


class InvalidText(EmbeddingError):
    """A text that cannot be embedded: empty or only whitespace."""


class ModalityUnavailable(EmbeddingError):
    """The served model cannot embed this kind of item (text without a reproducible tokenizer);
    the reason says why."""


class UrlRefused(EmbeddingError):
    """A URL item the guard will not fetch: URL inputs off, a scheme other than http(s), or a
    host that is (or resolves to) an address on the deny list. The reason names the rule, never
    the address a name resolved to."""


class UrlFailed(EmbeddingError):
    """A URL item that was fetched but gave no image bytes: an error status, a timeout, a body
    over the byte cap, a compressed body, too many redirects."""


class ImageTooLarge(EmbeddingError):
    """An image whose header promises more pixels (or decoder memory) than the budget allows."""


class BodyTooSlow(EmbeddingError):
    """The request body did not arrive in time (a slow or stalled client)."""


class ClientGone(EmbeddingError):
    """The client disconnected; its pending work was cancelled."""


class Overloaded(EmbeddingError):
    """Admitting this request would exceed the in-flight budget: refused at once, not queued."""


class Overspent(Overloaded):
    """A request whose decodes spent more than the multiple of their price it was admitted for:
    stopped where it was, the rest of its items not decoded."""


class DeadlineExceeded(EmbeddingError):
    """The request's own deadline passed."""


class BackendUnavailable(EmbeddingError):
    """The inference backend cannot take work now (down, restarting, shedding load)."""


class BackendTimeout(EmbeddingError):
    """The backend did not answer before the deadline it was given."""


class BackendFailed(EmbeddingError):
    """The backend answered with an error, or with something that breaks the contract."""


class UpstreamUnavailable(EmbeddingError):
    """No configured Immich upstream accepted the connection (all down, refused or
    unresolvable)."""


class UpstreamBusy(UpstreamUnavailable):
    """This worker already has its limit of forwards to Immich's upstream in flight."""


class UpstreamTimeout(EmbeddingError):
    """Immich's upstream did not answer within the forward's timeout."""


class UpstreamFailed(EmbeddingError):
    """Immich's upstream broke the exchange (closed mid-answer, not HTTP, an oversized
    answer)."""
