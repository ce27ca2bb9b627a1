"""Request and response types of the HTTP API: the JSON request is decoded into them, the
OpenAPI document is generated from them (clip_gateway/http/docs.py), and tests hold responses to
them.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

EncodingFormat = Literal["float", "base64"]
BinaryDtype = Literal["float32", "float16"]
Modality = Literal["text", "image"]


class ImageUrl(msgspec.Struct, forbid_unknown_fields=False):
    """OpenAI's ``image_url`` part: ``{"url": "https://..." or "data:image/...;base64,..."}``."""

    url: str


class InputObject(msgspec.Struct, forbid_unknown_fields=True):
    """One item named by its kind: ``{"text": "a cat"}``, ``{"image": "<base64, data: or an
    http(s) URL>"}``, or OpenAI's ``{"type": "image_url", "image_url": {"url": ...}}`` (and
    ``{"type": "text", "text": ...}``). URLs are fetched only where the operator turned URL
    items on (``GATEWAY_URL_INPUTS``)."""

    text: str | msgspec.UnsetType = msgspec.UNSET
    image: str | msgspec.UnsetType = msgspec.UNSET
    type: Literal["text", "image_url"] | msgspec.UnsetType = msgspec.UNSET
    image_url: ImageUrl | msgspec.UnsetType = msgspec.UNSET


class EmbeddingRequest(msgspec.Struct, forbid_unknown_fields=False):
    """OpenAI's embeddings request. A string in ``input`` is a text, unless it is a
    ``data:image/...;base64,`` URI (an image) or ``modality`` says otherwise; objects name their
    kind. Texts and images may be mixed: one space, answered in input order."""

    input: str | list[str | InputObject]
    model: str | None = None
    #: Every item is this kind (Infinity's field): ``image`` makes bare base64 strings images.
    modality: Modality | None = None
    #: ``base64``: little-endian float32 bytes, as OpenAI's client asks for by default.
    encoding_format: EncodingFormat = "float"
    #: Not OpenAI's: ``false`` returns the raw (not unit-length) embedding.
    normalize: bool | None = None
    #: Not OpenAI's: ``true`` embeds the good items and lists the bad ones in ``errors``.
    skip_invalid: bool | None = None
    #: OpenAI's truncated embeddings: refused (400) unless it is the model's own dimension. CLIP
    #: models are not trained for truncation (no Matryoshka loss), so a prefix of their
    #: embedding is not a meaningful embedding; /v1/models says ``dimensions: [embed_dim]``.
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
    #: Text tokens fed to the model (start and end tokens included, padding not).
    prompt_tokens: int
    total_tokens: int
    #: Images embedded (images carry no text tokens).
    images: int
    #: Texts embedded.
    texts: int


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


class PreprocessingCard(msgspec.Struct, omit_defaults=True):
    """/v1/models' account of what the gateway does to an image before the model (the model's
    own configuration, ``ModelPreprocessing``)."""

    size: int
    #: ``shortest`` (resize the short side, centre crop), ``longest`` (resize the long side,
    #: pad with ``fill_color``) or ``squash`` (both sides to ``size``).
    resize_mode: str
    interpolation: str
    center_crop: bool
    fill_color: list[int] | msgspec.UnsetType = msgspec.UNSET
    #: Applied inside the model graph.
    mean: list[float] | msgspec.UnsetType = msgspec.UNSET
    std: list[float] | msgspec.UnsetType = msgspec.UNSET
    #: The pretrained tag this preprocessing is from.
    from_tag: str | msgspec.UnsetType = msgspec.UNSET


class ImagingPath(msgspec.Struct):
    """Which image path runs here: pillow-simd (the fast resize) or stock Pillow."""

    #: The distribution and version that resize (and decode PNG/WebP/GIF), e.g.
    #: ``pillow-simd 12.1.1.post0``.
    resize: str
    #: The JPEG decoder and the PNG/WebP/GIF one.
    decode: str
    #: Whether the resize runs pillow-simd's SIMD resampler.
    simd: bool


class TextTokenizer(msgspec.Struct, omit_defaults=True):
    """How the gateway turns a text into the model's tokens, as open_clip does for this model."""

    #: ``clip_bpe`` (open_clip's CLIP BPE) or ``hf`` (a Hugging Face tokenizer: SigLIP, SigLIP2,
    #: multilingual towers).
    kind: str
    #: Tokens a text is read up to (longer texts are truncated, as open_clip does).
    context_length: int
    #: open_clip's cleaning before tokenising: ``lower``, ``whitespace`` or ``canonicalize``
    #: (lower-cased, ASCII punctuation removed).
    clean: str
    #: How the text graph pools its tokens (``argmax``: at the end token; ``last``: the last
    #: position, padding included), when the export recorded it.
    pooling: str | msgspec.UnsetType = msgspec.UNSET


class ModelCard(msgspec.Struct, omit_defaults=True):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    aliases: list[str]
    #: False while the backend cannot describe the model (Triton down or loading).
    ready: bool
    #: What the model embeds: ``image``, and ``text`` when a tokenizer is served.
    modalities: list[str] | msgspec.UnsetType = msgspec.UNSET
    #: One space for both: the dimension of every embedding.
    embed_dim: int | msgspec.UnsetType = msgspec.UNSET
    #: The values OpenAI's ``dimensions`` parameter may take: only ``embed_dim`` (the model does
    #: not declare truncated embeddings meaningful; any other value is refused with 400).
    dimensions: list[int] | msgspec.UnsetType = msgspec.UNSET
    image_size: int | msgspec.UnsetType = msgspec.UNSET
    #: Tokens a text is read up to (longer texts are truncated, as open_clip does).
    context_length: int | msgspec.UnsetType = msgspec.UNSET
    #: The text tokenizer, when texts are served.
    tokenizer: TextTokenizer | msgspec.UnsetType = msgspec.UNSET
    preprocessing: PreprocessingCard | msgspec.UnsetType = msgspec.UNSET
    #: Why texts cannot be embedded, when ``text`` is not among the modalities.
    text_unavailable: str | msgspec.UnsetType = msgspec.UNSET
    #: Per tower (``image``, ``text``): ``precision`` (``int8``; ``fp32`` with ``fallback``, why,
    #: when INT8 was asked for and refused), the method and the INT8 quality gate's figures.
    #: Only with the ``cpu-int8`` profile; with ``cpu-bf16``: ``precision`` ``bf16``, ``runtime``
    #: ``openvino`` and its version, BF16 vs FP32 figures and the gate (or ``fp32`` + ``fallback``).
    quantization: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET
    #: The libraries that decode and resize images in this gateway (clip_gateway/imaging/paths.py).
    imaging: ImagingPath | msgspec.UnsetType = msgspec.UNSET
    #: The names Immich's ``/predict`` answers to (``GATEWAY_IMMICH``; docs/IMMICH.md).
    immich_names: list[str] | msgspec.UnsetType = msgspec.UNSET


class ModelList(msgspec.Struct):
    object: Literal["list"]
    data: list[ModelCard]


class Health(msgspec.Struct, omit_defaults=True):
    status: str
    canary: str | msgspec.UnsetType = msgspec.UNSET
