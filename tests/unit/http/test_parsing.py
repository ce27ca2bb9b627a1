"""Request bodies to items: multipart streaming order and limits, OpenAI JSON validation."""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import AsyncIterator

import pytest

from clip_gateway.errors import (
    InvalidFields,
    LimitExceeded,
    MalformedRequest,
    UnsupportedFormat,
)
from clip_gateway.http import parsing
from clip_gateway.pipeline.items import ImageItem, TextItem

BOUNDARY = "b0undary"


def body(parts: list[tuple[str, bytes, str | None]]) -> bytes:
    out = b""
    for name, data, filename in parts:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        out += (
            f"--{BOUNDARY}\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + data + b"\r\n"
        )
    return out + f"--{BOUNDARY}--\r\n".encode()


async def chunked(data: bytes, size: int) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]
    yield b""


def parse(
    data: bytes, chunk: int = 7, max_items: int = 8, max_bytes: int = 1000
) -> parsing.ParsedRequest:
    return asyncio.run(
        parsing.parse_multipart(
            chunked(data, chunk),
            BOUNDARY,
            max_items=max_items,
            max_image_bytes=max_bytes,
            max_text_chars=max_bytes,
        )
    )


@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_multipart_keeps_arrival_order_and_reads_options(chunk: int) -> None:
    raw = body([
        ("a", b"first", "1.jpg"),
        ("normalize", b"false", None),
        ("b", b"second", "2.jpg"),
        ("a", b"third", "3.jpg"),
        ("encoding_format", b"base64", None),
        ("model", b"ViT-B-32", None),
    ])  # fmt: skip
    parsed = parse(raw, chunk)
    assert parsed.items == [ImageItem(b"first"), ImageItem(b"second"), ImageItem(b"third")]
    assert (parsed.normalize, parsed.encoding_format, parsed.model) == (False, "base64", "ViT-B-32")


@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_multipart_text_fields_are_texts_in_arrival_order(chunk: int) -> None:
    raw = body([
        ("text", "a photo of a café".encode(), None),
        ("image", b"first", "1.jpg"),
        ("text", b"  spaces kept  ", None),
        ("text", b"from a file", "query.txt"),
        ("image", b"second", "2.jpg"),
    ])  # fmt: skip
    assert parse(raw, chunk).items == [
        TextItem("a photo of a café"), ImageItem(b"first"), TextItem("  spaces kept  "),
        TextItem("from a file"), ImageItem(b"second"),
    ]  # fmt: skip


def test_multipart_text_in_a_declared_charset_and_a_wrong_one() -> None:
    latin = (
        (
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="text"\r\n'
            "Content-Type: text/plain; charset=latin-1\r\n\r\n"
        ).encode()
        + "café".encode("latin-1")
        + f"\r\n--{BOUNDARY}--\r\n".encode()
    )
    assert parse(latin).items == [TextItem("café")]
    with pytest.raises(
        MalformedRequest, match=r"input\[0\] \(form field 'text'\) is not valid utf-8"
    ):
        parse(body([("text", "café".encode("latin-1"), None)]))


def test_multipart_reports_each_item_as_it_completes() -> None:
    seen: list[object] = []
    raw = body([("image", b"x", "1.jpg"), ("text", b"a cat", None), ("model", b"m", None)])
    asyncio.run(
        parsing.parse_multipart(
            chunked(raw, 5),
            BOUNDARY,
            max_items=8,
            max_image_bytes=100,
            max_text_chars=100,
            on_item=seen.append,
        )
    )
    assert seen == [ImageItem(b"x"), TextItem("a cat")]  # options are not items


def test_multipart_limits() -> None:
    with pytest.raises(LimitExceeded) as too_big:
        parse(body([("image", b"ok", "a"), ("image", b"x" * 2000, "b")]))
    assert too_big.value.index == 1
    with pytest.raises(LimitExceeded):
        parse(body([("image", b"x", str(i)) for i in range(9)]), max_items=8)
    with pytest.raises(MalformedRequest, match="no items"):
        parse(body([("model", b"ViT-B-32", None)]))


def test_multipart_bad_option_values() -> None:
    with pytest.raises(MalformedRequest, match="normalize"):
        parse(body([("image", b"x", "a"), ("normalize", b"maybe", None)]))
    with pytest.raises(MalformedRequest, match="encoding_format"):
        parse(body([("image", b"x", "a"), ("encoding_format", b"hex", None)]))


def test_multipart_malformed() -> None:
    with pytest.raises(MalformedRequest):
        parse(f"--{BOUNDARY}\r\nbroken".encode())


def test_json_forms() -> None:
    one = parsing.parse_json(b'{"input": "QUJD"}', 4, 1000)
    assert one.items == [TextItem("QUJD")]  # a string is a text
    assert (one.encoding_format, one.normalize, one.model) == ("float", None, None)
    many = parsing.parse_json(
        b'{"input": ["a", "b"], "encoding_format": "base64", "user": "u"}', 4, 1000
    )
    assert many.items == [TextItem("a"), TextItem("b")]
    assert many.encoding_format == "base64"


#: base64 of a JPEG's first bytes (ff d8 ff e0 ...), as the image-only API was sent images
JPEG_B64 = base64.b64encode(b"\xff\xd8\xff\xe0" + bytes(range(60))).decode()
DATA_URI = "data:image/jpeg;base64," + JPEG_B64


def items_of(input_json: str, modality: str | None = None) -> list[object]:
    extra = f', "modality": "{modality}"' if modality else ""
    raw = f'{{"input": {input_json}{extra}}}'.encode()
    return list(parsing.parse_json(raw, 8, 10_000).items)


def test_json_strings_are_texts_unless_image_data_uris_or_the_modality_says_so() -> None:
    assert items_of(f'["a cat", "{DATA_URI}"]') == [
        TextItem("a cat"),
        ImageItem.from_base64(DATA_URI),
    ]
    assert items_of(f'["{JPEG_B64}", "{DATA_URI}"]', "image") == [
        ImageItem.from_base64(JPEG_B64), ImageItem.from_base64(DATA_URI),
    ]  # fmt: skip
    # modality text: every string is a text, even one that looks like an image
    assert items_of(f'["{DATA_URI}", "{JPEG_B64}"]', "text") == [
        TextItem(DATA_URI), TextItem(JPEG_B64),
    ]  # fmt: skip
    # other data: URIs are texts (only image ones are images)
    assert items_of('["data:text/plain,hi"]') == [TextItem("data:text/plain,hi")]


def test_json_objects_say_what_they_are() -> None:
    found = items_of(f'[{{"text": "a dog"}}, {{"image": "{JPEG_B64}"}}, "a bird"]')
    assert found == [TextItem("a dog"), ImageItem.from_base64(JPEG_B64), TextItem("a bird")]
    assert items_of(f'[{{"image": "{JPEG_B64}"}}]', "image") == [ImageItem.from_base64(JPEG_B64)]


@pytest.mark.parametrize(
    ("input_json", "modality", "expected"),
    [
        ('[{"text": "a", "image": "b"}]', None, 'input[0] must have exactly one of "text"'),
        ('["x", {}]', None, 'input[1] must have exactly one of "text"'),
        ('["x", {"text": "a"}]', "image", 'input[1] is an {"text": ...} object but'),
        ('[{"image": "QUJD"}]', "text", 'input[0] is an {"image": ...} object but'),
        ('[{"txt": "a"}]', None, "invalid embeddings request"),
    ],
)
def test_json_objects_that_contradict_themselves_or_the_modality(
    input_json: str, modality: str | None, expected: str
) -> None:
    with pytest.raises(InvalidFields) as raised:
        items_of(input_json, modality)
    assert expected in raised.value.reason


@pytest.mark.parametrize(
    "start", [b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"RIFF\0\0\0\0WEBP", b"GIF89a"]
)
def test_a_bare_base64_image_is_refused_as_ambiguous_naming_the_item(start: bytes) -> None:
    """Clients of the image-only API sent images as bare base64: embedding them as texts
    would answer nonsense silently. They get a 422 saying how to send them."""
    encoded = base64.b64encode(start + bytes(range(48))).decode()
    with pytest.raises(InvalidFields) as raised:
        items_of(f'["a cat", "{encoded}"]')
    assert raised.value.index == 1
    assert "looks like a base64-encoded image" in raised.value.reason
    assert '"modality": "image"' in raised.value.reason
    assert items_of(f'["{encoded}"]', "image") == [ImageItem.from_base64(encoded)]
    # not base64 after the start (a sentence): a text
    assert items_of('["/9j/ is how a base64 JPEG starts"]') == [
        TextItem("/9j/ is how a base64 JPEG starts")
    ]


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (b'{"input": ', MalformedRequest),
        (b'{"input": 1}', InvalidFields),
        (b"{}", InvalidFields),
        (b'{"input": []}', MalformedRequest),
        (b'{"input": ["a","b","c","d","e"]}', LimitExceeded),
    ],
)
def test_json_errors(raw: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        parsing.parse_json(raw, 4, 1000)


def test_multipart_option_fields_and_images_are_told_apart_by_filename() -> None:
    raw = body([
        ("image", b"no filename", None),  # not an option name: an image even without a filename
        ("model", b"a file called model", "model.jpg"),  # an option name with a file: an image
        ("skip_invalid", b" Yes \r\n", None),
        ("normalize", b"ON", None),
        ("encoding_format", b"float", None),
    ])  # fmt: skip
    parsed = parse(raw)
    assert parsed == parsing.ParsedRequest(
        [ImageItem(b"no filename"), ImageItem(b"a file called model")], None, "float", True, True
    )


def test_multipart_defaults_when_no_option_is_sent() -> None:
    parsed = parse(body([("image", b"x", "a")]))
    assert parsed == parsing.ParsedRequest([ImageItem(b"x")], None, None, None, None)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("1", True), ("true", True), ("TRUE", True), ("yes", True), ("on", True),
     ("0", False), ("false", False), ("False", False), ("no", False), ("off", False),
     ("OFF", False)],
)  # fmt: skip
def test_multipart_flags(value: str, expected: bool) -> None:
    parsed = parse(
        body([
            ("image", b"x", "a"),
            ("normalize", value.encode(), None),
            ("skip_invalid", value.encode(), None),
        ])
    )  # fmt: skip
    assert (parsed.normalize, parsed.skip_invalid) == (expected, expected)


@pytest.mark.parametrize("name", ["normalize", "skip_invalid"])
def test_multipart_bad_flag_names_the_field_and_value(name: str) -> None:
    with pytest.raises(MalformedRequest) as raised:
        parse(body([("image", b"x", "a"), (name, b"maybe", None)]))
    assert raised.value.reason == f"{name} must be true or false, not 'maybe'"


def test_multipart_bad_encoding_format_message() -> None:
    with pytest.raises(MalformedRequest) as raised:
        parse(body([("image", b"x", "a"), ("encoding_format", b"FLOAT", None)]))
    assert raised.value.reason == "encoding_format must be 'float' or 'base64', not 'FLOAT'"


def test_multipart_image_count_limit_is_inclusive() -> None:
    assert len(parse(body([("image", b"x", str(i)) for i in range(8)]), max_items=8).items) == 8
    with pytest.raises(LimitExceeded) as raised:
        parse(body([("image", b"x", str(i)) for i in range(9)]), max_items=8)
    assert raised.value.reason == "9 items in one request; the limit is 8"
    assert raised.value.index == 8


def test_multipart_stops_parsing_at_the_segment_limit() -> None:
    """Images plus the option fields: the parser refuses the next part, however many follow."""
    with pytest.raises(LimitExceeded) as raised:
        parse(body([("image", b"x", str(i)) for i in range(50)]), max_items=2)
    assert raised.value.index == 6  # 2 images + 4 option fields were allowed
    assert raised.value.reason == (
        "multipart limit reached at part 6: Maximum segment count exceeded (at most 2 items, "
        "each part at most 1000 bytes)"
    )


def test_multipart_part_size_limit_names_the_part() -> None:
    with pytest.raises(LimitExceeded) as raised:
        parse(body([("image", b"ok", "a"), ("image", b"x" * 1001, "b")]), max_bytes=1000)
    assert raised.value.index == 1
    assert raised.value.reason.startswith("multipart limit reached at part 1: ")
    assert parse(body([("image", b"x" * 1000, "b")]), max_bytes=1000).items == [
        ImageItem(b"x" * 1000)
    ]


def header_part(headers: int) -> bytes:
    extra = "".join(f"X-Extra-{i}: {i}\r\n" for i in range(headers - 1))
    return (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="image"; filename="a"\r\n{extra}'
        f"\r\nimage\r\n--{BOUNDARY}--\r\n"
    ).encode()


def test_multipart_header_count_limit() -> None:
    assert parse(header_part(16)).items == [ImageItem(b"image")]
    with pytest.raises(LimitExceeded, match="Maximum segment header count exceeded"):
        parse(header_part(17))


def test_multipart_malformed_message() -> None:
    with pytest.raises(MalformedRequest, match=r"^malformed multipart body: "):
        parse(f"--{BOUNDARY}\r\nbroken".encode())


def test_no_images_message() -> None:
    with pytest.raises(MalformedRequest) as raised:
        parse(body([("model", b"m", None)]))
    assert raised.value.reason == "no items (images or texts) in the request"


def test_json_passes_every_option_through() -> None:
    raw = (
        b'{"input": ["a"], "model": "ViT-B-32", "encoding_format": "base64", "normalize": false,'
        b' "skip_invalid": true, "dimensions": 512, "user": "u", "unknown": 1}'
    )
    parsed = parsing.parse_json(raw, 4, 1000)
    assert parsed == parsing.ParsedRequest(
        [TextItem("a")], "ViT-B-32", "base64", False, True, dimensions=512
    )


def test_json_count_limit_is_inclusive() -> None:
    assert len(parsing.parse_json(b'{"input": ["a","b","c","d"]}', 4, 1000).items) == 4
    with pytest.raises(LimitExceeded) as raised:
        parsing.parse_json(b'{"input": ["a","b","c","d","e"]}', 4, 1000)
    assert (raised.value.reason, raised.value.index) == (
        "more than 4 items in one request; the limit is 4",
        4,
    )


def test_json_error_messages() -> None:
    with pytest.raises(MalformedRequest, match=r"^malformed JSON: "):
        parsing.parse_json(b'{"input": ', 4, 1000)
    with pytest.raises(InvalidFields) as raised:
        parsing.parse_json(b'{"input": "a", "encoding_format": "hex"}', 4, 1000)
    assert raised.value.reason.startswith("invalid embeddings request: ")
    assert "encoding_format" in raised.value.reason


@pytest.mark.parametrize(
    ("input_json", "modality", "index"),
    [
        ('[{"text": "a", "image": "b"}]', None, 0),
        ('["x", "y", {}]', None, 2),
        ('["x", {"text": "a"}]', "image", 1),
    ],
)
def test_contradicting_objects_name_their_item(
    input_json: str, modality: str | None, index: int
) -> None:
    with pytest.raises(InvalidFields) as raised:
        items_of(input_json, modality)
    assert raised.value.index == index


def test_the_ambiguous_base64_message_says_every_way_to_send_an_image() -> None:
    encoded = base64.b64encode(b"\xff\xd8\xff" + bytes(48)).decode()
    with pytest.raises(InvalidFields) as raised:
        items_of(f'["{encoded}"]')
    assert raised.value.reason == (
        "input[0] looks like a base64-encoded image, not a text: send it as a "
        'data:image/...;base64, URI or an {"image": ...} object, or set "modality": "image"'
    )


@pytest.mark.parametrize("max_bytes", [100, 3000, 3001])
def test_a_string_may_be_as_long_as_base64_of_the_byte_limit_plus_a_data_header(
    max_bytes: int,
) -> None:
    longest = 4 * -(-max_bytes // 3) + 256
    (item,) = parsing.parse_json(f'{{"input": "{"a" * longest}"}}'.encode(), 4, max_bytes).items
    assert item == TextItem("a" * longest)
    parsing.parse_json(f'{{"input": ["{"a" * longest}"]}}'.encode(), 4, max_bytes)
    for over in (f'"{"a" * (longest + 1)}"', f'["b", "{"a" * (longest + 1)}"]'):
        with pytest.raises(LimitExceeded, match=f"item over {longest} characters"):
            parsing.parse_json(f'{{"input": {over}}}'.encode(), 4, max_bytes)


def test_hostile_nesting_is_malformed_json_not_a_crash() -> None:
    deep = b'{"input": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(MalformedRequest) as raised:
        parsing.parse_json(deep, 8, 1000)
    assert raised.value.reason == "malformed JSON: nested too deep"


@pytest.mark.parametrize(
    ("input_json", "index"),
    [
        ('"{long}"', 0),
        ('["short", "{long}"]', 1),
        ('[{{"text": "{long}"}}]', 0),
        ('["a", "b", {{"image": "{long}"}}]', 2),
        ('["a", {{"image": "{long}", "text": "b"}}]', 1),
    ],
)
def test_an_over_long_string_names_the_item_that_holds_it(input_json: str, index: int) -> None:
    longest = 4 * -(-100 // 3) + 256
    raw = '{"input": ' + input_json.format(long="a" * (longest + 1)) + "}"
    with pytest.raises(LimitExceeded) as raised:
        parsing.parse_json(raw.encode(), 4, 100)
    assert raised.value.index == index


def test_items_past_the_limit_are_refused_at_the_first_one_whatever_follows() -> None:
    """msgspec counts the items and stops at the first past the limit: ten million tiny items
    are refused as fast as two, naming the first item over (it built nothing for them)."""
    for count in (2, 10_000_000):
        raw = b'{"input": [' + b'"a",' * (count - 1) + b'"a"]}'
        with pytest.raises(LimitExceeded) as refused:
            parsing.parse_json(raw, 1, 1000)
        assert refused.value.index == 1
    assert parsing.parse_json(b'{"input": ["a"]}', 1, 1000).items == [TextItem("a")]


def test_an_item_that_is_neither_a_string_nor_an_object_is_a_schema_error() -> None:
    long = "a" * 2000
    for nested in ('["a", ["b", "LONG"]]', "[[[]" + ",1" * 22 + "]]"):
        with pytest.raises(InvalidFields, match=re.escape("Expected `str | object`, got `array`")):
            parsing.parse_json(f'{{"input": {nested.replace("LONG", long)}}}'.encode(), 4, 100)


# Client bytes (issue 31): every byte sequence and charset a client chooses is a 4xx naming the
# item, with the byte where it went wrong. tests/api/test_client_bytes.py holds the same over
# HTTP; these pin the messages and indexes at the parser, where they are made.

UTF8 = "JSON text must be UTF-8 (RFC 8259)"
LONE = (
    "has a lone UTF-16 surrogate escape (\\ud800-\\udfff without its pair): not a Unicode "
    "character; send valid UTF-8 or a surrogate pair"
)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"plain ascii and caf\xc3\xa9", None),
        (b"", None),
        (b"\xff at the start", (0, 1)),
        (b"abc\xc3", (3, 4)),  # a sequence cut short by the end of the body
        (b"ab\xe2\x82(", (2, 4)),  # cut short by another character
        (b"a" * (1 << 20) + b"\xc3\xa9" * 3 + b"\xff", ((1 << 20) + 6, (1 << 20) + 7)),
        (b"a" * ((1 << 20) - 1) + b"\xc3\xa9" + b"b" * (1 << 21) + b"\xc0\xaf",
         ((1 << 21) + (1 << 20) + 1, (1 << 21) + (1 << 20) + 2)),  # a character across steps
        (b"a" * (3 << 20) + b"\xc3\xa9", None),
    ],
)  # fmt: skip
def test_the_first_invalid_utf8_sequence_is_found_in_any_step(
    data: bytes, expected: tuple[int, int] | None
) -> None:
    assert parsing._invalid_utf8(data) == expected
    assert parsing._invalid_utf8(bytearray(data)) == expected


@pytest.mark.parametrize(
    ("raw", "message", "index"),
    [
        (b'{"input": "a \xff"}', f"input[0] is not valid UTF-8 (byte 3 of input): {UTF8}", 0),
        (b'{"input": ["fine", "a \xff"]}',
         f"input[1] is not valid UTF-8 (byte 12 of input): {UTF8}", 1),
        (b'{"input": ["a", "\xff", "a"]}', f"input[1] is not valid UTF-8 (byte 7 of input): {UTF8}",
         1),  # the same item after it is not the one at fault
        (b'{"input":  [ "ok" ,  {"text": "caf\xc3\xa9"}, {"image": "x\xc3"} ] , "model": "m"}',
         f"input[2] is not valid UTF-8 (byte 41 of input): {UTF8}", 2),
        (b'{"input": ["\xed\xa0\x80"]}', f"input[0] is not valid UTF-8 (byte 2 of input): {UTF8}",
         0),  # a surrogate encoded as UTF-8 (CESU-8)
        (b'{"input": [{"text": "a", "\xff": 1}]}',
         f"input[0] is not valid UTF-8 (byte 16 of input): {UTF8}", 0),  # in a key
        (b'{"model": "\xff", "input": ["a"]}',
         f"the request body is not valid UTF-8 (byte 11): {UTF8}", None),
        (b'{"input": ["a"], "user": "ok", "model": "\xc3("}',
         f"the request body is not valid UTF-8 (byte 41): {UTF8}", None),
    ],
)  # fmt: skip
def test_invalid_utf8_names_the_item_and_the_byte(
    raw: bytes, message: str, index: int | None
) -> None:
    with pytest.raises(MalformedRequest) as raised:
        parsing.parse_json(raw, 8, 1000)
    assert (raised.value.reason, raised.value.index) == (message, index)


@pytest.mark.parametrize(
    ("raw", "index"),
    [
        (b'{"input": "\\ud800"}', 0),
        (b'{"input": ["\\udc00"]}', 0),  # a low one: msgspec says "surrogate"
        (b'{"input": ["a", "b", "\\ud800"]}', 2),  # a high one: msgspec says "truncated"
        (b'{"input": ["caf\\u00e9", "\\udfff"]}', 1),  # not ASCII is not a surrogate
        (b'{"input": ["' + b"\\ud83d\\ude00" * 20 + b'", "x\\ud800"]}', 1),  # pairs first
        (b'{"input": ["\\\\ud800 is text", {"image": "\\udfff"}]}', 1),  # an escaped backslash
        (b'{"input": [{"text": "a"}, {"text": "b"}, "\\ud800"]}', 2),
        (b'{"input": ["a", {"text": "b"}, {"image": "\\ud800"}]}', 2),
        (b'{"modality": "text", "input": [1, 2, "\\ud800\\ud800"]}', 2),
        (b'{"input": [{"text": "a", "n": 1, "o": {"p": [1, 2]}}, true, "\\ud800"]}', 2),
    ],
)
def test_a_lone_surrogate_escape_names_its_item(raw: bytes, index: int) -> None:
    with pytest.raises(MalformedRequest) as raised:
        parsing.parse_json(raw, 8, 1000)
    assert (raised.value.reason, raised.value.index) == (f"input[{index}] {LONE}", index)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b'{"input": ["a"], "model": "\\ud800"}', "Input data was truncated"),  # not in input
        (b'{"input": "a", "model": "\\udc00"}',
         "JSON is malformed: invalid utf-16 surrogate pair (byte 31)"),
        (b'{"input": ["a" "\\ud800"]}', "JSON is malformed: expected ',' or ']' (byte 15)"),
        (b'{"input": ', "Input data was truncated"),
        (b'{"model": "\\ud800"}', "Input data was truncated"),  # no input at all
    ],
)  # fmt: skip
def test_other_malformed_json_is_not_blamed_on_an_item(raw: bytes, message: str) -> None:
    with pytest.raises(MalformedRequest) as raised:
        parsing.parse_json(raw, 8, 1000)
    assert (raised.value.reason, raised.value.index) == (f"malformed JSON: {message}", None)


@pytest.mark.parametrize(
    ("text", "index"),
    [
        ('{"input": ["a\tb", "\\ud800"]}', 1),  # a raw control character is read, not refused
        ('{"input": [' + "1," * 23 + '"\\ud800"]}', 23),  # the 48th token: within the budget
        ('{"input": [' + "1," * 24 + '"\\ud800"]}', None),  # the 50th: past it
        ('{"input": [{"a": {"b": 1}}, "\\ud800"]}', 1),
        ('{"input": [{"a": {"b": 1}}, {"c": "\\ud800"}]}', 1),
        ('{"input": ["a", ["b"], "c"], "x": ["\\ud800"]}', None),
        ('{"input": ["a", "b"', None),
    ],
)
def test_the_surrogate_search_walks_a_bounded_number_of_tokens(
    text: str, index: int | None
) -> None:
    """Sixteen tokens per item allowed (and two more), whatever the body: ``max_items`` 1."""
    assert parsing._surrogate_item(text, 1) == index


def test_an_object_item_may_hold_a_string_as_long_as_the_limit() -> None:
    longest = 4 * -(-100 // 3) + 256
    for key in ("text", "image"):
        raw = f'{{"input": ["b", {{"{key}": "{"a" * longest}"}}]}}'
        assert len(parsing.parse_json(raw.encode(), 4, 100).items) == 2
        with pytest.raises(LimitExceeded) as raised:
            parsing.parse_json(raw.replace('"}', 'a"}').encode(), 4, 100)
        assert (raised.value.reason, raised.value.index) == (f"item over {longest} characters", 1)


def test_a_long_item_that_is_not_an_object_does_not_hide_a_later_long_string() -> None:
    long = "a" * 2000
    with pytest.raises(LimitExceeded) as raised:
        parsing.parse_json(f'{{"input": [["{long}"], "{long}"]}}'.encode(), 4, 100)
    assert raised.value.index == 1


def test_url_and_typed_image_parts() -> None:
    url = "https://example.com/a.jpg"
    found = items_of(
        f'["a", {{"image": "{url}"}}, {{"type": "image_url", "image_url": {{"url": "{url}"}}}},'
        ' {"type": "text", "text": "b"}]'
    )
    assert found == [TextItem("a"), ImageItem(url=url), ImageItem(url=url), TextItem("b")]
    for part in (f'{{"image_url": {{"url": "{url}"}}}}', '{"type": "image_url"}'):
        with pytest.raises(InvalidFields) as raised:
            items_of(f'["a", {part}]')
        assert (raised.value.reason, raised.value.index) == (
            'input[1]: a typed part is {"type": "image_url", "image_url": {"url": ...}} '
            'or {"type": "text", "text": ...}',
            1,
        )


def form_part(name: str, data: bytes, content_type: str | None = None) -> bytes:
    head = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n'
    if content_type:
        head += f"Content-Type: {content_type}\r\n"
    return head.encode() + b"\r\n" + data + b"\r\n"


def parse_form(*parts: bytes, max_text_chars: int = 10) -> parsing.ParsedRequest:
    raw = b"".join(parts) + f"--{BOUNDARY}--\r\n".encode()
    return asyncio.run(
        parsing.parse_multipart(
            chunked(raw, 5),
            BOUNDARY,
            max_items=8,
            max_image_bytes=10_000,
            max_text_chars=max_text_chars,
        )
    )


ACCEPTED = "accepted: utf-8, us-ascii, iso-8859-1, windows-1252 (or no charset: UTF-8)"


@pytest.mark.parametrize(
    ("charset", "shown"),
    [("utf-7", "'utf-7'"), ("punycode", "'punycode'"), ("x" * 50, repr("x" * 40))],
)
def test_a_part_in_a_charset_not_taken_is_refused_naming_it(charset: str, shown: str) -> None:
    declared = f"text/plain; charset={charset}"
    with pytest.raises(UnsupportedFormat) as raised:
        parse_form(form_part("text", b"a cat"), form_part("text", b"+2AA-", declared))
    assert (raised.value.reason, raised.value.index) == (
        f"input[1] (form field 'text') declares charset {shown}; {ACCEPTED}",
        1,
    )
    with pytest.raises(UnsupportedFormat) as option:
        parse_form(form_part("text", b"a cat"), form_part("model", b"m", declared))
    assert (option.value.reason, option.value.index) == (
        f"form field 'model' declares charset {shown}; {ACCEPTED}",
        None,
    )


def test_text_and_option_parts_are_read_in_their_declared_charset() -> None:
    latin = "text/plain; charset=ISO-8859-1"
    parsed = parse_form(
        form_part("text", "café".encode("latin-1"), latin),
        form_part("model", " modèle ".encode("latin-1"), latin),
    )
    assert (parsed.items, parsed.model) == ([TextItem("café")], "modèle")


@pytest.mark.parametrize(
    ("part", "message", "index"),
    [
        (form_part("text", b"caf\xe9", "text/plain; charset=us-ascii"),
         "input[1] (form field 'text') is not valid ascii (ordinal not in range(128) at byte 3)",
         1),
        (form_part("text", b"caf\xed\xa0\x80"),
         "input[1] (form field 'text') is not valid utf-8 (invalid continuation byte at byte 3)",
         1),
        (form_part("model", b"\xffm"),
         "form field 'model' is not valid utf-8 (invalid start byte at byte 0)", None),
        (form_part("normalize", b"\x81", "text/plain; charset=windows-1252"),
         "form field 'normalize' is not valid cp1252 (character maps to <undefined> at byte 0)",
         None),
    ],
)  # fmt: skip
def test_bytes_that_are_not_the_declared_charset_name_the_part_and_the_byte(
    part: bytes, message: str, index: int | None
) -> None:
    with pytest.raises(MalformedRequest) as raised:
        parse_form(form_part("text", b"ok"), part)
    assert (raised.value.reason, raised.value.index) == (message, index)


def test_text_and_option_parts_are_bounded_as_they_stream_in() -> None:
    """A text part may take four bytes per character (UTF-8), an option 4096 bytes; one byte
    more is refused before the part is decoded."""
    assert parse_form(form_part("text", b"a" * 40), max_text_chars=10).items == [TextItem("a" * 40)]
    with pytest.raises(LimitExceeded) as text:
        parse_form(form_part("image", b"x"), form_part("text", b"a" * 41), max_text_chars=10)
    assert (text.value.reason, text.value.index, text.value.extra) == (
        "input[1] (form field 'text') is over 40 bytes (longer than the text limit in any charset)",
        1,
        {"limit": 40},
    )
    longest = parse_form(form_part("text", b"a"), form_part("model", b"m" * 4096))
    assert longest.model == "m" * 4096
    with pytest.raises(LimitExceeded) as option:
        parse_form(form_part("text", b"a"), form_part("model", b"m" * 4097))
    assert (option.value.reason, option.value.index, option.value.extra) == (
        "form field 'model' is over 4096 bytes",
        None,
        {"limit": 4096},
    )
