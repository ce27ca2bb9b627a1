"""Which JSON items are URL items (http/parsing.py with http/urls/items.py): only those that
say so; a bare string never is, and OpenAI's typed parts map onto our own objects."""

from __future__ import annotations

import json

import pytest

from clip_gateway.errors import InvalidFields
from clip_gateway.http.parsing import parse_json
from clip_gateway.pipeline.items import ImageItem, TextItem


def items(*values: object) -> list[object]:
    body = json.dumps({"input": list(values)}).encode()
    return list(parse_json(body, 16, 1 << 20).items)


def test_url_items_are_only_those_that_say_so() -> None:
    parsed = items(
        "https://images.example/cat.jpg",
        {"image": "https://images.example/cat.jpg"},
        {"image": "HTTP://images.example/dog.jpg"},
        {"type": "image_url", "image_url": {"url": "https://images.example/cat.jpg"}},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "text", "text": "a cat"},
    )
    assert parsed[0] == TextItem("https://images.example/cat.jpg")  # a bare string: a text
    assert parsed[1] == ImageItem(url="https://images.example/cat.jpg")
    assert parsed[2] == ImageItem(url="HTTP://images.example/dog.jpg")
    assert parsed[3] == parsed[1]
    assert parsed[4] == ImageItem.from_base64("data:image/png;base64,iVBORw0KGgo=")  # not fetched
    assert parsed[5] == TextItem("a cat")


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url"},
        {"type": "image_url", "image_url": {"url": "x"}, "image": "y"},
        {"type": "text", "image_url": {"url": "https://a/"}},
        {"image_url": {"url": "https://a/"}},
    ],
)
def test_a_malformed_typed_part_is_refused_naming_it(part: dict[str, object]) -> None:
    with pytest.raises(InvalidFields) as refused:
        items("a text", part)
    assert refused.value.index == 1 and refused.value.reason.startswith("input[1]")
