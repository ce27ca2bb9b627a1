"""Immich's ``/predict`` form (``immich_ml/main.py``): its ``entries`` field naming the task,
and an ``image`` part or a ``text`` field, read by the one form reader (http/forms.py), each
field bounded while it streams in; then checked in the order Immich's own server checks it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import msgspec
from multipart import MultipartSegment, ParserError, ParserLimitReached

from clip_gateway.config.settings import ServerSettings
from clip_gateway.errors import (
    InvalidFields,
    LimitExceeded,
    MalformedRequest,
    OtherModel,
    UnsupportedTask,
)
from clip_gateway.http import forms
from clip_gateway.pipeline.admission import Reservation
from clip_gateway.pipeline.items import ImageItem, Item, TextItem

#: Immich's ``entries`` for one CLIP call is under 100 bytes; anything near this is not Immich.
#: The same bound holds any other form field (an ``assetId``), read and dropped.
MAX_ENTRIES_BYTES = 16 << 10
#: Parts in one /predict body: entries, image or text, and a few Immich may add (``assetId``).
MAX_PARTS = 8
#: What each CLIP model type needs from the form.
NEEDS = {"visual": "image", "textual": "text"}
_TEXT = "form field 'text'"
#: Immich's ``clean_name`` (``immich_ml/config.py``): the last path segment of a model name,
#: ``:`` ``\\`` ``/`` made ``_``, ``.`` dropped: ``immich-app/ViT-B-32__openai`` is that model.
_CLEAN_NAME = str.maketrans(":\\/", "___", ".")


class Form(msgspec.Struct):
    entries: bytes | None = None
    image: ImageItem | None = None
    text: TextItem | None = None


async def read_predict(
    content_type: tuple[str, dict[str, str]],
    chunks: AsyncIterator[bytes],
    settings: ServerSettings,
    reservation: Reservation,
) -> Form:
    """The form's ``entries``, ``image`` and ``text``, each bounded while it streams in (other
    fields are read and dropped); the image or text is admitted as soon as it is complete."""
    media_type, options = content_type
    if media_type != "multipart/form-data" or not options.get("boundary"):
        raise InvalidFields(
            "Immich's /predict takes multipart/form-data with an `entries` field, "
            f"not {media_type or '(no Content-Type)'}"
        )
    fields = _Fields(settings, reservation)
    limits = forms.Limits(
        parts=MAX_PARTS,
        part_bytes=max(settings.max_image_bytes, MAX_ENTRIES_BYTES),
        headers=16,
    )
    await forms.read_form(chunks, options["boundary"], fields, limits)
    return fields.form


@dataclass(frozen=True)
class _Field:
    name: str | None
    #: Its bytes at most: the image up to the image limit, the text to what the text limit can
    #: take in UTF-8, anything else (entries, an assetId) is small.
    limit: int
    charset: str | None = None

    def too_large(self) -> LimitExceeded:
        return LimitExceeded(
            f"form field {self.name!r} is over its {self.limit} bytes", limit=self.limit
        )


class _Fields:
    """/predict's form as the form reader fills it."""

    def __init__(self, settings: ServerSettings, reservation: Reservation) -> None:
        self.form = Form()
        self.reservation = reservation
        self.limits = {
            "image": settings.max_image_bytes,
            "text": settings.max_text_chars * forms.MAX_BYTES_PER_CHAR,
        }

    def begin(self, segment: MultipartSegment) -> _Field:
        name = segment.name
        if name == "text":  # its charset refused before its bytes are read
            forms.text_codec(segment.charset, _TEXT)
        return _Field(name, self.limits.get(name or "", MAX_ENTRIES_BYTES), segment.charset)

    def end(self, field: _Field, data: bytes) -> bool:
        form, name = self.form, field.name
        if name in ("entries", "image", "text") and getattr(form, name) is not None:
            raise MalformedRequest(f"form field {name!r} given twice")
        if name == "entries":
            form.entries = data
        elif name == "image":
            form.image = ImageItem(data)
            self.reservation.add(form.image)
        elif name == "text":
            codec = forms.text_codec(field.charset, _TEXT)
            form.text = TextItem(forms.decode_text(data, codec, _TEXT))
            self.reservation.add(form.text)
        return False

    def refused(self, exc: ParserError | ParserLimitReached) -> LimitExceeded | MalformedRequest:
        if isinstance(exc, ParserLimitReached):
            return LimitExceeded(f"multipart limit reached: {exc}")
        return forms.malformed(exc)


def check_form(form: Form, settings: ServerSettings) -> tuple[str, Item]:
    """The model type asked for (``visual``/``textual``) and its item, or the reason why not,
    in the order Immich's own server checks: entries (422), an input at all (400), then the
    task (501) and the model name (409)."""
    if form.entries is None:
        raise InvalidFields("the `entries` form field is missing (Immich's task description)")
    tasks = parse_entries(form.entries)
    if form.image is None and form.text is None:
        raise MalformedRequest("Either image or text must be provided")
    if len(tasks) != 1 or tasks[0][:2] not in (("clip", "visual"), ("clip", "textual")):
        asked = ", ".join(f"{task}.{kind}" for task, kind, _ in tasks)
        raise UnsupportedTask(
            f"this gateway serves one CLIP encoding per request (clip.visual or clip.textual), "
            f"not {asked}: Immich's next machine-learning URL serves it"
        )
    _, kind, name = tasks[0]
    if clean_name(name) not in settings.immich_names:
        served = ", ".join(settings.immich_names) or "no Immich name (GATEWAY_IMMICH_ALIASES)"
        raise OtherModel(f"model {name!r} is not served here; served: {served}")
    if kind == "visual":
        if form.image is None:
            raise MalformedRequest("clip.visual needs an `image` part")
        return kind, form.image
    if form.text is None:
        raise MalformedRequest("clip.textual needs a `text` field")
    return kind, form.text


def served_here(entries: bytes | None, settings: ServerSettings) -> bool:
    """One CLIP encoding of a model served here; everything else is the upstream's. A mixed
    request goes there whole, as Immich's server answers one (docs/IMMICH.md)."""
    if entries is None:
        return False
    try:
        tasks = parse_entries(entries)
    except InvalidFields:
        return False  # the upstream answers it as Immich does (422)
    if len(tasks) != 1:
        return False
    task, kind, name = tasks[0]
    return task == "clip" and kind in NEEDS and clean_name(name) in settings.immich_names


def clean_name(name: str) -> str:
    """A model name as Immich's ML server reads it (``immich_ml/config.py``'s ``clean_name``)."""
    return name.split("/")[-1].translate(_CLEAN_NAME)


def parse_entries(raw: bytes) -> list[tuple[str, str, str]]:
    """``{task: {type: {"modelName": ..., "options": {...}}}}`` as (task, type, modelName)
    triples; anything else is 422, as Immich's ``get_entries`` answers."""
    try:
        request = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise InvalidFields(f"`entries` is not JSON: {exc}") from exc
    except UnicodeDecodeError as exc:  # msgspec's answer to invalid UTF-8 inside a string
        raise InvalidFields(
            f"`entries` is not valid UTF-8 ({exc.reason} in a string): JSON text must be UTF-8"
        ) from None
    except RecursionError as exc:  # 16 KiB of brackets nest deeper than the decoder recurses
        raise InvalidFields("`entries` nests too deeply") from exc
    if not isinstance(request, dict) or not request:
        raise InvalidFields('`entries` must be an object such as {"clip": {"visual": {...}}}')
    out = []
    for task, types in request.items():
        if not isinstance(types, dict) or not types:
            raise InvalidFields(f"`entries.{task}` must be an object of model types")
        for kind, entry in types.items():
            if not isinstance(entry, dict) or not isinstance(entry.get("modelName"), str):
                raise InvalidFields(f"`entries.{task}.{kind}` needs a `modelName` string")
            if not isinstance(entry.get("options", {}), dict):
                raise InvalidFields(f"`entries.{task}.{kind}.options` must be an object")
            out.append((task, kind, entry["modelName"]))
    return out
