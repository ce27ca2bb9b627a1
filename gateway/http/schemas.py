"""Request and response types of the HTTP API: the JSON request is decoded into them, the
OpenAPI document is generated from them (gateway/http/docs.py), and tests hold responses to them.
"""

from __future__ import annotations

from typing import Literal

import msgspec

EncodingFormat = Literal["float", "base64"]
BinaryDtype = Literal["float32", "float16"]


class EmbeddingRequest(msgspec.Struct, forbid_unknown_fields=False):
    """OpenAI's embeddings request, with images as base64 strings or ``data:`` URIs."""

    input: str | list[str]
    model: str | None = None
    #: ``base64``: little-endian float32 bytes, as OpenAI's client asks for by default.
    encoding_format: EncodingFormat = "float"
    #: Not OpenAI's: ``false`` returns the raw (not unit-length) embedding.
    normalize: bool | None = None
    #: Not OpenAI's: ``true`` embeds the good items and lists the bad ones in ``errors``.
    skip_invalid: bool | None = None
    #: Accepted for OpenAI compatibility; only the model's own dimension is served.
    dimensions: int | None = None
    user: str | None = None


#: Multipart form fields that are options, not items (the JSON request's names).
FORM_OPTIONS = ("model", "encoding_format", "normalize", "skip_invalid")


class Embedding(msgspec.Struct):
    object: Literal["embedding"]
    #: The item's position in the request (kept when ``skip_invalid`` leaves some out).
    index: int
    #: Floats, or base64 of little-endian float32 bytes (``encoding_format=base64``).
    embedding: list[float] | str


class Usage(msgspec.Struct):
    prompt_tokens: int
    total_tokens: int
    #: Images embedded (images carry no text tokens).
    images: int


class ItemError(msgspec.Struct):
    """One item left out by ``skip_invalid``, in the terms of a problem document."""

    index: int
    status: int
    type: str
    title: str
    detail: str


class EmbeddingResponse(msgspec.Struct, omit_defaults=True):
    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: Usage
    #: Only with ``skip_invalid``: the items that could not be embedded.
    errors: list[ItemError] | msgspec.UnsetType = msgspec.UNSET


class Problem(msgspec.Struct, omit_defaults=True):
    """RFC 9457 problem details; ``index`` names the item at fault when there is one."""

    type: str
    title: str
    status: int
    detail: str | msgspec.UnsetType = msgspec.UNSET
    index: int | msgspec.UnsetType = msgspec.UNSET


class ModelCard(msgspec.Struct, omit_defaults=True):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    aliases: list[str]
    #: False while the backend cannot describe the model (Triton down or loading).
    ready: bool
    embed_dim: int | msgspec.UnsetType = msgspec.UNSET
    image_size: int | msgspec.UnsetType = msgspec.UNSET


class ModelList(msgspec.Struct):
    object: Literal["list"]
    data: list[ModelCard]


class Health(msgspec.Struct, omit_defaults=True):
    status: str
    canary: str | msgspec.UnsetType = msgspec.UNSET
