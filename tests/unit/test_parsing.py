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
    one = parsing.parse_json(b'{"input": "QUJD"}', 4)
    assert one.items == ["QUJD"]
    assert (one.encoding_format, one.normalize, one.model) == ("float", None, None)
    many = parsing.parse_json(b'{"input": ["a", "b"], "encoding_format": "base64", "user": "u"}', 4)
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
        parsing.parse_json(raw, 4)
