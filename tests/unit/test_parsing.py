"""Request bodies to items: multipart streaming order and limits, OpenAI JSON validation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from gateway.errors import InvalidFields, LimitExceeded, MalformedRequest
from gateway.http import parsing

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
    data: bytes, chunk: int = 7, max_images: int = 8, max_bytes: int = 1000
) -> parsing.ParsedRequest:
    return asyncio.run(
        parsing.parse_multipart(
            chunked(data, chunk), BOUNDARY, max_images=max_images, max_image_bytes=max_bytes
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
    assert parsed.items == [b"first", b"second", b"third"]
    assert (parsed.normalize, parsed.encoding_format, parsed.model) == (False, "base64", "ViT-B-32")


def test_multipart_limits() -> None:
    with pytest.raises(LimitExceeded) as too_big:
        parse(body([("image", b"ok", "a"), ("image", b"x" * 2000, "b")]))
    assert too_big.value.index == 1
    with pytest.raises(LimitExceeded):
        parse(body([("image", b"x", str(i)) for i in range(9)]), max_images=8)
    with pytest.raises(MalformedRequest, match="no images"):
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
    assert one.items == ["QUJD"]
    assert (one.encoding_format, one.normalize, one.model) == ("float", None, None)
    many = parsing.parse_json(
        b'{"input": ["a", "b"], "encoding_format": "base64", "user": "u"}', 4, 1000
    )
    assert many.items == ["a", "b"]
    assert many.encoding_format == "base64"


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
        [b"no filename", b"a file called model"], None, "float", True, True
    )


def test_multipart_defaults_when_no_option_is_sent() -> None:
    parsed = parse(body([("image", b"x", "a")]))
    assert parsed == parsing.ParsedRequest([b"x"], None, None, None, None)


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
    assert len(parse(body([("image", b"x", str(i)) for i in range(8)]), max_images=8).items) == 8
    with pytest.raises(LimitExceeded) as raised:
        parse(body([("image", b"x", str(i)) for i in range(9)]), max_images=8)
    assert raised.value.reason == "9 images in one request; the limit is 8"
    assert raised.value.index == 8


def test_multipart_stops_parsing_at_the_segment_limit() -> None:
    """Images plus the option fields: the parser refuses the next part, however many follow."""
    with pytest.raises(LimitExceeded) as raised:
        parse(body([("image", b"x", str(i)) for i in range(50)]), max_images=2)
    assert raised.value.index == 6  # 2 images + 4 option fields were allowed
    assert raised.value.reason == (
        "multipart limit reached at part 6: Maximum segment count exceeded (at most 2 images "
        "of at most 1000 bytes each)"
    )


def test_multipart_part_size_limit_names_the_part() -> None:
    with pytest.raises(LimitExceeded) as raised:
        parse(body([("image", b"ok", "a"), ("image", b"x" * 1001, "b")]), max_bytes=1000)
    assert raised.value.index == 1
    assert raised.value.reason.startswith("multipart limit reached at part 1: ")
    assert parse(body([("image", b"x" * 1000, "b")]), max_bytes=1000).items == [b"x" * 1000]


def header_part(headers: int) -> bytes:
    extra = "".join(f"X-Extra-{i}: {i}\r\n" for i in range(headers - 1))
    return (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="image"; filename="a"\r\n{extra}'
        f"\r\nimage\r\n--{BOUNDARY}--\r\n"
    ).encode()


def test_multipart_header_count_limit() -> None:
    assert parse(header_part(16)).items == [b"image"]
    with pytest.raises(LimitExceeded, match="Maximum segment header count exceeded"):
        parse(header_part(17))


def test_multipart_malformed_message() -> None:
    with pytest.raises(MalformedRequest, match=r"^malformed multipart body: "):
        parse(f"--{BOUNDARY}\r\nbroken".encode())


def test_no_images_message() -> None:
    with pytest.raises(MalformedRequest) as raised:
        parse(body([("model", b"m", None)]))
    assert raised.value.reason == "no images in the request"


def test_json_passes_every_option_through() -> None:
    raw = (
        b'{"input": ["a"], "model": "ViT-B-32", "encoding_format": "base64", "normalize": false,'
        b' "skip_invalid": true, "dimensions": 512, "user": "u", "unknown": 1}'
    )
    parsed = parsing.parse_json(raw, 4, 1000)
    assert parsed == parsing.ParsedRequest(["a"], "ViT-B-32", "base64", False, True)


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
