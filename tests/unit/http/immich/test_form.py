"""Immich's /predict form (http/immich/form.py) read by the one form reader: its fields, each
bounded while it streams in and refused naming it, the image or text admitted as soon as it is
complete; then checked in Immich's order. The routes over it: tests/api/test_immich.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from clip_gateway.config.settings import ServerSettings
from clip_gateway.errors import (
    InvalidFields,
    LimitExceeded,
    MalformedRequest,
    OtherModel,
    UnsupportedFormat,
    UnsupportedTask,
)
from clip_gateway.http import forms
from clip_gateway.http.immich import form as immich_form
from clip_gateway.pipeline.items import ImageItem, Item, TextItem
from tests.unit.http.test_forms import Spy

BOUNDARY = "imm1ch"
NAME = "ViT-B-32__openai"
VISUAL = json.dumps({"clip": {"visual": {"modelName": NAME}}}).encode()
TEXTUAL = json.dumps({"clip": {"textual": {"modelName": NAME}}}).encode()
SETTINGS = ServerSettings(
    immich=True, immich_aliases=(NAME,), max_image_bytes=64 << 10, max_text_chars=10
)


def part(name: str, data: bytes, content_type: str | None = None) -> bytes:
    head = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n'
    if content_type:
        head += f"Content-Type: {content_type}\r\n"
    return head.encode() + b"\r\n" + data + b"\r\n"


class Admitted:
    """What the form reader asks of a reservation: items added as they complete."""

    def __init__(self) -> None:
        self.items: list[Item] = []

    def add(self, item: Item) -> None:
        self.items.append(item)


async def chunks(data: bytes, size: int) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]
    yield b""


def read(
    *parts: bytes,
    media_type: str = "multipart/form-data",
    size: int = 7,
    reservation: Admitted | None = None,
) -> immich_form.Form:
    body = b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()
    content_type = (media_type, {"boundary": BOUNDARY})
    return asyncio.run(
        immich_form.read_predict(content_type, chunks(body, size), SETTINGS,
                                 reservation or Admitted())  # type: ignore[arg-type]
    )  # fmt: skip


def test_entries_image_and_text_are_read_and_other_fields_dropped() -> None:
    admitted = Admitted()
    form = read(
        part("entries", VISUAL),
        part("assetId", b"a1b2"),
        part("image", b"\xff\xd8jpeg"),
        reservation=admitted,
    )
    assert (form.entries, form.image, form.text) == (VISUAL, ImageItem(b"\xff\xd8jpeg"), None)
    assert admitted.items == [form.image]  # admitted as soon as it was complete
    text = read(part("entries", TEXTUAL), part("text", "été".encode("latin-1"),
                                                "text/plain; charset=iso-8859-1"))  # fmt: skip
    assert text.text == TextItem("été")


def test_the_image_is_the_parsers_own_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """No copy: an image part that arrives in one chunk is the bytes the parser made."""
    monkeypatch.setattr(forms, "PushMultipartParser", Spy)
    Spy.seen = []
    form = read(part("entries", VISUAL), part("image", b"i" * 900), size=1 << 12)
    assert form.image is not None and form.image.data is Spy.seen[-1]


def test_a_body_that_is_not_a_form_is_422_naming_what_it_is() -> None:
    with pytest.raises(InvalidFields) as raised:
        read(part("entries", VISUAL), media_type="application/json")
    assert raised.value.reason == (
        "Immich's /predict takes multipart/form-data with an `entries` field, not application/json"
    )
    with pytest.raises(InvalidFields, match=r"not \(no Content-Type\)$"):
        read(part("entries", VISUAL), media_type="")


#: The image's limit is the parser's own (the largest a part may be): it refuses first.
OVER_THE_PARSERS = "multipart limit reached: Maximum segment size exceeded"


@pytest.mark.parametrize(
    ("name", "limit", "refusal"),
    [
        ("image", 64 << 10, OVER_THE_PARSERS),
        ("text", 40, "form field 'text' is over its 40 bytes"),
        ("entries", 16 << 10, "form field 'entries' is over its 16384 bytes"),
        ("assetId", 16 << 10, "form field 'assetId' is over its 16384 bytes"),
    ],
)
def test_each_field_is_bounded_while_it_streams_in(name: str, limit: int, refusal: str) -> None:
    whole = read(part(name, b"x" * limit))
    assert whole.entries == b"x" * limit if name == "entries" else whole.entries is None
    admitted = Admitted()
    with pytest.raises(LimitExceeded) as raised:
        read(part(name, b"x" * (limit + 1)), part("image", b"never read"), reservation=admitted)
    assert raised.value.reason == refusal
    assert raised.value.extra == ({} if refusal == OVER_THE_PARSERS else {"limit": limit})
    assert admitted.items == []


def test_a_text_in_a_charset_not_taken_is_refused_before_its_bytes() -> None:
    with pytest.raises(UnsupportedFormat) as raised:
        read(part("entries", TEXTUAL), part("text", b"+2AA-", "text/plain; charset=utf-7"))
    assert raised.value.reason.startswith("form field 'text' declares charset 'utf-7'")
    with pytest.raises(MalformedRequest) as bad:
        read(part("entries", TEXTUAL), part("text", b"caf\xe9"))
    assert bad.value.reason.startswith("form field 'text' is not valid utf-8")


@pytest.mark.parametrize("name", ["entries", "image", "text"])
def test_a_field_given_twice_is_refused(name: str) -> None:
    with pytest.raises(MalformedRequest) as raised:
        read(part(name, b"x"), part(name, b"y"))
    assert raised.value.reason == f"form field {name!r} given twice"


def test_what_the_parser_refuses_is_413_or_400() -> None:
    with pytest.raises(LimitExceeded) as many:
        read(*(part(f"f{i}", b"") for i in range(9)))
    assert many.value.reason == "multipart limit reached: Maximum segment count exceeded"
    with pytest.raises(MalformedRequest, match=r"^malformed multipart body: "):
        asyncio.run(
            immich_form.read_predict(
                ("multipart/form-data", {"boundary": BOUNDARY}),
                chunks(f"--{BOUNDARY}\r\nbroken".encode(), 4),
                SETTINGS,
                Admitted(),  # type: ignore[arg-type]
            )
        )


def test_the_form_is_checked_in_immichs_order() -> None:
    image, text = ImageItem(b"i"), TextItem("a cat")
    check = immich_form.check_form
    with pytest.raises(InvalidFields, match="`entries` form field is missing"):
        check(immich_form.Form(image=image), SETTINGS)
    with pytest.raises(InvalidFields, match="is not JSON"):
        check(immich_form.Form(entries=b"{", image=image), SETTINGS)
    with pytest.raises(MalformedRequest, match="Either image or text must be provided"):
        check(immich_form.Form(entries=b'{"facial-recognition": {"x": {"modelName": "m"}}}'),
              SETTINGS)  # fmt: skip
    with pytest.raises(UnsupportedTask, match=r"not facial-recognition\.detection"):
        check(immich_form.Form(
            entries=b'{"facial-recognition": {"detection": {"modelName": "m"}}}', image=image,
        ), SETTINGS)  # fmt: skip
    with pytest.raises(OtherModel, match="'other' is not served here; served: ViT-B-32__openai"):
        check(immich_form.Form(entries=b'{"clip": {"visual": {"modelName": "other"}}}',
                               image=image), SETTINGS)  # fmt: skip
    with pytest.raises(MalformedRequest, match=r"clip\.visual needs an `image` part"):
        check(immich_form.Form(entries=VISUAL, text=text), SETTINGS)
    with pytest.raises(MalformedRequest, match=r"clip\.textual needs a `text` field"):
        check(immich_form.Form(entries=TEXTUAL, image=image), SETTINGS)
    assert check(immich_form.Form(entries=VISUAL, image=image), SETTINGS) == ("visual", image)
    assert check(immich_form.Form(entries=TEXTUAL, text=text), SETTINGS) == ("textual", text)


@pytest.mark.parametrize(
    ("entries", "here"),
    [
        (VISUAL, True),
        (TEXTUAL, True),
        (json.dumps({"clip": {"visual": {"modelName": f"immich-app/{NAME}"}}}).encode(), True),
        (json.dumps({"clip": {"visual": {"modelName": "other"}}}).encode(), False),
        (b'{"facial-recognition": {"detection": {"modelName": "m"}}}', False),
        (b'{"clip": {"visual": {"modelName": "ViT-B-32__openai"}, '
         b'"textual": {"modelName": "ViT-B-32__openai"}}}', False),  # several: the upstream's
        (b"not json", False),  # the upstream answers it as Immich does
        (None, False),  # no entries in reach
    ],
)  # fmt: skip
def test_only_one_clip_encoding_of_a_served_model_is_served_here(
    entries: bytes | None, here: bool
) -> None:
    assert immich_form.served_here(entries, SETTINGS) is here
