"""pipeline/items.py: base64 image items decoded strictly (line breaks and spaces allowed), and
each refusal saying what was wrong and what to send instead."""

from __future__ import annotations

import pytest

from clip_gateway.errors import InvalidImage
from clip_gateway.pipeline.items import ImageItem, item_bytes

SEND = "send standard base64 (RFC 4648 section 4: A-Z a-z 0-9 + /, = padding)"


@pytest.mark.parametrize("text", ["QUJD-A==", "QUJD_A=="], ids=["minus", "underscore"])
def test_either_url_safe_character_alone_is_refused_naming_the_alphabet(text: str) -> None:
    with pytest.raises(InvalidImage) as raised:
        item_bytes(ImageItem.from_base64(text))
    assert raised.value.reason == (
        f"base64 with - or _ (the URL-safe alphabet) is not accepted; {SEND}"
    )


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("QUJ", "Incorrect padding"),
        # without its space, the same: what is wrong with it then, not that it had a space
        ("QU J", "Incorrect padding"),
        # whitespace is the only thing a second chance forgives: the rest is still refused
        ("QUJD\n!!!!", "Only base64 data is allowed"),
    ],
    ids=["padding", "padding-after-a-space", "alphabet-after-a-line-break"],
)
def test_invalid_base64_is_refused_saying_why_and_what_to_send(text: str, why: str) -> None:
    with pytest.raises(InvalidImage) as raised:
        item_bytes(ImageItem.from_base64(text))
    assert raised.value.reason == f"invalid base64: {why}; {SEND}"
