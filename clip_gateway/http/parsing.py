"""Request bodies to items: multipart parts in order, or the OpenAI JSON shape.

Which items are texts and which images (docs/API.md "Texts and images"): in JSON a string is a text
unless it is a ``data:image/...`` URI or ``modality`` is ``image``; ``{"text": ...}`` and
``{"image": ...}`` objects say what they are. A bare string that is base64 of a JPEG, PNG, WebP
or GIF without ``modality`` is refused as ambiguous rather than embedded as text (clients of
the image-only API sent images that way). A URL item is ``{"image": "http(s)://..."}`` or
OpenAI's ``{"type": "image_url", "image_url": {"url": ...}}``, never a bare string (http/urls/
fetches it). In multipart (read by http/forms.py), ``text`` fields are texts and every other
part that is not an option is an image.

Bounded while reading, before objects are built (the body's bytes are bounded as they arrive,
in http/body.py): the number of parts and each part's size (the form reader's limits), and in
JSON the number of items and each string's length (msgspec checks them while decoding).
Each image part is reported as soon as it is complete (``on_item``, the request's
``Reservation.add``) so admission can stop reading a body whose cost no longer fits. Items come
out typed: an ``ImageItem`` (raw bytes, or the base64 text JSON carried) or a ``TextItem``.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import cache
from json.decoder import scanstring  # type: ignore[attr-defined]
from typing import Any

import msgspec
from multipart import MultipartSegment, ParserError, ParserLimitReached

from clip_gateway.errors import EmbeddingError, InvalidFields, LimitExceeded, MalformedRequest
from clip_gateway.http import forms
from clip_gateway.http.schemas import (
    FORM_OPTIONS,
    EmbeddingRequest,
    EncodingFormat,
    InputObject,
    Modality,
)
from clip_gateway.pipeline.items import ImageItem, Item, TextItem

#: Multipart fields that are options, not items. ``text`` fields are texts; every other part is
#: an image, in order.
OPTION_FIELDS = frozenset(FORM_OPTIONS)
TEXT_FIELD = "text"
#: Base64 of the first bytes of a JPEG, PNG, WebP (RIFF) and GIF.
_BASE64_IMAGE_STARTS = ("/9j/", "iVBORw0KGgo", "UklGR", "R0lGOD")
_BASE64 = re.compile(r"[A-Za-z0-9+/\r\n]{24,}={0,2}\s*")


@dataclass(frozen=True)
class ParsedRequest:
    items: list[Item]
    model: str | None
    encoding_format: EncodingFormat | None
    normalize: bool | None
    skip_invalid: bool | None = None
    dimensions: int | None = None


def _encoded_chars(max_bytes: int) -> int:
    """Characters a base64 string of ``max_bytes`` takes, plus room for a ``data:`` header."""
    return 4 * -(-max_bytes // 3) + 256


@cache
def _envelope() -> type[EmbeddingRequest]:
    """EmbeddingRequest with ``input`` left raw: msgspec skips over it (no object is built) so
    its items can be counted and measured before any is decoded."""
    fields: list[Any] = [("input", msgspec.Raw)]
    for field in msgspec.structs.fields(EmbeddingRequest)[1:]:
        fields.append((field.name, field.type, field.default))
    envelope = msgspec.defstruct("EmbeddingRequest", fields, forbid_unknown_fields=False)
    return envelope  # type: ignore[return-value]


_INPUT = msgspec.structs.fields(EmbeddingRequest)[0].type


@cache
def _listed(max_items: int) -> type[msgspec.Struct]:
    """A list of at most ``max_items`` raw items: msgspec stops at the first item past them
    (one field too many), and builds nothing but a view per item."""
    fields = [(f"i{i}", msgspec.Raw, msgspec.UNSET) for i in range(max_items)]
    return msgspec.defstruct("Listed", fields, array_like=True, forbid_unknown_fields=True)


def _raw_items(raw: msgspec.Raw | bytes | memoryview, max_items: int) -> list[msgspec.Raw]:
    """The raw items of a JSON list, or ``LimitExceeded`` past ``max_items`` of them."""
    try:
        listed = msgspec.json.decode(raw, type=_listed(max_items))
    except msgspec.ValidationError as exc:
        raise LimitExceeded(
            f"more than {max_items} items in one request; the limit is {max_items}",
            index=max_items,
        ) from exc
    return [item for item in msgspec.structs.astuple(listed) if item is not msgspec.UNSET]


def _scan_input(raw: msgspec.Raw | bytes | memoryview, max_items: int, max_chars: int) -> None:
    """Refuse too many items or an over-long string in ``input`` before any object is built,
    naming the first item over a limit. msgspec walks the bytes (at C speed, escapes and all);
    Python sees one view per item, at most ``max_items`` of them, whatever the body."""
    kind = bytes(memoryview(raw)[:1])
    if kind == b'"':
        if len(raw) - 2 > max_chars:
            raise LimitExceeded(f"item over {max_chars} characters", index=0)
        return
    if kind != b"[":
        return  # not a string or a list: msgspec reports the type error
    try:
        items = _raw_items(raw, max_items)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return  # malformed: decoding the input reports it, naming the item
    for index, item in enumerate(items):
        if len(item) - 2 <= max_chars:  # no string inside is longer than the item
            continue
        if bytes(memoryview(item)[:1]) == b'"':
            raise LimitExceeded(f"item over {max_chars} characters", index=index)
        try:  # one object, decoded alone: its strings are within the body already read
            value = msgspec.json.decode(item, type=InputObject)
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
            continue  # not an item object: the schema refuses it
        if any(isinstance(v, str) and len(v) > max_chars for v in (value.text, value.image)):
            raise LimitExceeded(f"item over {max_chars} characters", index=index)


_INPUT_KEY = re.compile(r'"input"\s*+:\s*+')
#: One JSON token in decoded text: a bracket, a comma or colon, a string's opening quote (the
#: string is read by the json module's C scanner), or a bare scalar.
_TEXT_TOKEN = re.compile(r'\s*+([\[\]{},:"]|[^\s\[\]{},:"]++)')
_SURROGATE = re.compile("[\ud800-\udfff]")
#: What JSON text must be (RFC 8259 section 8.1), said in every refusal of other bytes.
_UTF8 = "JSON text must be UTF-8 (RFC 8259)"
_LONE = (
    "has a lone UTF-16 surrogate escape (\\ud800-\\udfff without its pair): not a Unicode "
    "character; send valid UTF-8 or a surrogate pair"
)
#: Bytes of the body checked as UTF-8 at once while looking for the first invalid one.
_UTF8_STEP = 1 << 20


def _invalid_utf8(body: bytes | bytearray | msgspec.Raw) -> tuple[int, int] | None:
    """Where the body's first invalid UTF-8 sequence starts and ends, or None; one C pass in
    steps, so no second copy of a large body is made."""
    view, pos = memoryview(body), 0
    while pos < len(view):
        step = view[pos : pos + _UTF8_STEP]
        try:
            _, used = codecs.utf_8_decode(step, "strict", pos + len(step) >= len(view))
        except UnicodeDecodeError as exc:
            return pos + exc.start, pos + exc.end
        pos += used
    return None


def _undecodable(body: bytes | bytearray, exc: Exception, max_items: int) -> MalformedRequest:
    """The refusal of a body msgspec could not decode, naming the ``input`` item holding a lone
    surrogate escape (msgspec reports one as truncated input)."""
    if isinstance(exc, UnicodeDecodeError):  # in a field other than input: it is not decoded
        at = _invalid_utf8(body) or (0, 0)
        return MalformedRequest(f"the request body is not valid UTF-8 (byte {at[0]}): {_UTF8}")
    if any(word in str(exc) for word in ("truncated", "surrogate")):  # msgspec's words for a
        # lone surrogate escape, a high one reported as truncated input
        index = _surrogate_item(body.decode("utf-8", "replace"), max_items)
        if index is not None:
            return MalformedRequest(f"input[{index}] {_LONE}", index=index)
    return MalformedRequest(f"malformed JSON: {exc}")


def _not_utf8(raw: msgspec.Raw, max_items: int) -> MalformedRequest:
    """The refusal of an ``input`` holding invalid UTF-8 (msgspec says so without saying
    where), naming the item that holds the first invalid byte."""
    at, _ = _invalid_utf8(raw) or (0, 0)
    why = f"is not valid UTF-8 (byte {at} of input): {_UTF8}"
    data = bytes(raw)
    items = _raw_items(raw, max_items) if data[:1] == b"[" else [raw]
    cursor = 0
    for index, item in enumerate(items):
        cursor = data.find(bytes(item), cursor)  # in order, apart only by commas and spaces
        if cursor <= at < cursor + len(item):
            return MalformedRequest(f"input[{index}] {why}", index=index)
        cursor += len(item)
    return MalformedRequest(f"input {why}")


def _surrogate_item(text: str, max_items: int) -> int | None:
    """The index of the first ``input`` item holding a lone surrogate escape: its strings are
    read by the json module's C scanner (which decodes lone surrogates), at most the token
    budget of ``max_items`` of them."""
    key = _INPUT_KEY.search(text)
    if key is None:
        return None
    pos, depth, items = key.end(), 0, 0
    for _ in range(16 * (max_items + 2)):
        token = _TEXT_TOKEN.match(text, pos)
        if token is None:
            return None
        lead, pos = token[1][0], token.end()
        if lead == '"':
            try:
                value, pos = scanstring(text, pos, False)
            except ValueError:
                return None
            items += depth == 1
            if not value.isascii() and _SURROGATE.search(value):
                return max(items - 1, 0)
        elif lead in "[{":
            depth += 1
            items += depth == 2
        elif lead in "]}":
            depth -= 1
        elif lead not in ",:":
            items += depth == 1
        if depth <= 0:
            return None
    return None


def parse_json(body: bytes | bytearray, max_items: int, max_image_bytes: int) -> ParsedRequest:
    """The OpenAI embeddings request: ``max_items`` bounds the items, and
    ``max_image_bytes`` the length of any string (texts have their own, smaller limit, checked
    where they are embedded so ``skip_invalid`` can report them one by one)."""
    max_chars = _encoded_chars(max_image_bytes)
    try:
        request = msgspec.json.decode(body, type=_envelope())
        raw: msgspec.Raw = request.input  # type: ignore[assignment]
        try:
            _scan_input(raw, max_items, max_chars)
            value = msgspec.json.decode(raw, type=_INPUT)
        except UnicodeDecodeError:  # msgspec's answer to invalid UTF-8 inside a string
            raise _not_utf8(raw, max_items) from None
    except msgspec.ValidationError as exc:
        raise InvalidFields(f"invalid embeddings request: {exc}") from exc
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise _undecodable(body, exc, max_items) from None
    except RecursionError as exc:  # msgspec's own guard against hostile nesting
        raise MalformedRequest("malformed JSON: nested too deep") from exc
    items = _items([value] if isinstance(value, str) else value, request.modality)
    _check_count(len(items), max_items)
    return ParsedRequest(
        items,
        request.model,
        request.encoding_format,
        request.normalize,
        request.skip_invalid,
        request.dimensions,
    )


def _items(values: list[str | InputObject], modality: Modality | None) -> list[Item]:
    items: list[Item] = []
    for index, value in enumerate(values):
        if isinstance(value, InputObject):
            items.append(_object_item(value, index, modality))
        elif modality == "image" or (modality is None and value[:11].lower() == "data:image/"):
            items.append(ImageItem.from_base64(value))
        elif modality is None and _looks_like_base64_image(value):
            raise InvalidFields(
                f"input[{index}] looks like a base64-encoded image, not a text: send it as a "
                'data:image/...;base64, URI or an {"image": ...} object, or set '
                '"modality": "image"',
                index=index,
            )
        else:
            items.append(TextItem(value))
    return items


def _object_item(value: InputObject, index: int, modality: Modality | None) -> Item:
    if value.type is not msgspec.UNSET or value.image_url is not msgspec.UNSET:
        value = _openai_part(value, index)
    has_text, has_image = value.text is not msgspec.UNSET, value.image is not msgspec.UNSET
    if has_text == has_image:
        raise InvalidFields(
            f'input[{index}] must have exactly one of "text" or "image"', index=index
        )
    kind = "text" if has_text else "image"
    if modality is not None and modality != kind:
        raise InvalidFields(
            f'input[{index}] is an {{"{kind}": ...}} object but "modality" is {modality!r}',
            index=index,
        )
    if isinstance(value.text, str):
        return TextItem(value.text)
    if is_url(str(value.image)):
        return ImageItem(url=str(value.image))
    return ImageItem.from_base64(str(value.image))


def is_url(value: str) -> bool:
    """An ``image`` that is a URL item (http/urls/ fetches it): only ``http(s)://``."""
    return value[:8].lower().startswith(("http://", "https://"))


def _openai_part(value: InputObject, index: int) -> InputObject:
    """OpenAI's typed part as our own object: ``image_url`` to ``{"image": url}``, ``text`` as
    it is."""
    if value.type == "image_url" and isinstance(value.image_url, msgspec.Struct):
        if value.text is msgspec.UNSET and value.image is msgspec.UNSET:
            return InputObject(image=value.image_url.url)
    elif value.type == "text" and value.image_url is msgspec.UNSET:
        return InputObject(text=value.text)
    raise InvalidFields(
        f'input[{index}]: a typed part is {{"type": "image_url", "image_url": {{"url": ...}}}} '
        'or {"type": "text", "text": ...}',
        index=index,
    )


def _looks_like_base64_image(value: str) -> bool:
    return value.startswith(_BASE64_IMAGE_STARTS) and _BASE64.fullmatch(value) is not None


#: The longest option part (``model``, ``encoding_format``, ``normalize``, ``skip_invalid``).
MAX_OPTION_BYTES = 4096


@dataclass(frozen=True)
class _FormPart:
    """A text or option part being read: what the refusals call it, its byte limit and its
    codec, checked when its headers arrive."""

    name: str
    what: str
    index: int | None
    limit: int | None
    codec: str

    def too_large(self) -> LimitExceeded:
        return LimitExceeded(
            f"{self.what} is over {self.limit} bytes"
            + (" (longer than the text limit in any charset)" if self.index is not None else ""),
            index=self.index,
            limit=self.limit,
        )


#: Every image part: no limit but the form's (the image limit), no codec.
_IMAGE = _FormPart("", "an image", None, None, "")


class _Uploads:
    """/v1/embeddings' form as the form reader fills it: ``text`` fields are texts, option
    fields (without a filename) options, every other part an image, in arrival order; each
    item reported to ``on_item`` as soon as it is complete."""

    def __init__(
        self, max_items: int, max_image_bytes: int, max_text_chars: int,
        on_item: Callable[[Item], None],
    ) -> None:  # fmt: skip
        self.items: list[Item] = []
        self.options: dict[str, str] = {}
        self.max_items, self.max_image_bytes = max_items, max_image_bytes
        self.max_text_bytes = max_text_chars * forms.MAX_BYTES_PER_CHAR
        self.on_item = on_item

    def begin(self, segment: MultipartSegment) -> _FormPart:
        name = segment.name
        if name in OPTION_FIELDS and not segment.filename:
            what = f"form field {name!r}"
            return _FormPart(
                name, what, None, MAX_OPTION_BYTES, forms.text_codec(segment.charset, what)
            )
        if name == TEXT_FIELD:
            index = len(self.items)
            what = f"input[{index}] (form field {name!r})"
            codec = forms.text_codec(segment.charset, what, index)
            return _FormPart(name, what, index, self.max_text_bytes, codec)
        return _IMAGE

    def end(self, part: _FormPart, data: bytes) -> bool:
        if part is _IMAGE:
            item: Item = ImageItem(data)
        elif part.index is None:
            self.options[part.name] = forms.decode_text(data, part.codec, part.what).strip()
            return False
        else:
            item = TextItem(forms.decode_text(data, part.codec, part.what, part.index))
        self.on_item(item)  # may refuse: the rest is never read
        self.items.append(item)
        return False

    def refused(self, exc: ParserError | ParserLimitReached) -> EmbeddingError:
        if isinstance(exc, ParserLimitReached):
            at = len(self.items)
            return LimitExceeded(
                f"multipart limit reached at part {at}: {exc} (at most {self.max_items} items, "
                f"each part at most {self.max_image_bytes} bytes)",
                index=at,
            )
        return forms.malformed(exc)


async def parse_multipart(
    chunks: AsyncIterator[bytes],
    boundary: str,
    *,
    max_items: int,
    max_image_bytes: int,
    max_text_chars: int,
    on_item: Callable[[Item], None] = lambda _: None,
) -> ParsedRequest:
    """Stream-parse the body, keeping items in arrival order: ``text`` fields are texts, other
    parts (whatever their field names) images. Text and option parts are bounded while they
    stream in (a text to what ``max_text_chars`` can take) and decoded only once complete."""
    form = _Uploads(max_items, max_image_bytes, max_text_chars, on_item)
    limits = forms.Limits(
        parts=max_items + len(OPTION_FIELDS), part_bytes=max_image_bytes, headers=16
    )
    await forms.read_form(chunks, boundary, form, limits)
    _check_count(len(form.items), max_items)
    options = form.options
    return ParsedRequest(
        form.items,
        options.get("model"),
        _encoding_format(options.get("encoding_format")),
        _flag(options.get("normalize"), "normalize"),
        _flag(options.get("skip_invalid"), "skip_invalid"),
    )


def _check_count(count: int, max_items: int) -> None:
    if count == 0:
        raise MalformedRequest("no items (images or texts) in the request")
    if count > max_items:
        raise LimitExceeded(
            f"{count} items in one request; the limit is {max_items}", index=max_items
        )


def _encoding_format(value: str | None) -> EncodingFormat | None:
    if value is None or value in ("float", "base64"):
        return value  # type: ignore[return-value]
    raise MalformedRequest(f"encoding_format must be 'float' or 'base64', not {value!r}")


def _flag(value: str | None, name: str) -> bool | None:
    if value is None:
        return None
    lowered = value.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise MalformedRequest(f"{name} must be true or false, not {value!r}")
