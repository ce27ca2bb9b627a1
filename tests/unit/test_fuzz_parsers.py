"""Fuzz the parsers that read untrusted bytes before any decoder: container headers, the EXIF
reader and the JSON item scanner. Whatever the bytes, each returns or raises its own error type,
and the bounded answers agree with a full parser when the input is valid."""

from __future__ import annotations

import contextlib
import json

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clip_gateway.errors import InvalidFields, LimitExceeded, MalformedRequest
from clip_gateway.http.parsing import _scan_input, parse_json
from clip_gateway.imaging import containers, orientation
from tests import hostile, samples

SEEDS = {
    "png": samples.png(1),
    "webp": samples.webp(2),
    "webp-lossless": samples.encode(samples.small_photo(3), "WEBP", lossless=True),
    "gif": samples.gif(4),
}
READERS = {"png": containers.png, "webp": containers.webp, "webp-lossless": containers.webp,
           "gif": containers.gif}  # fmt: skip


@st.composite
def damaged(draw: st.DrawFn, seed: bytes) -> bytes:
    data = bytearray(seed)
    for _ in range(draw(st.integers(1, 8))):
        at = draw(st.integers(0, len(data) - 1))
        data[at] = draw(st.integers(0, 255))
    return bytes(data[: draw(st.integers(0, len(data)))])


@pytest.mark.slow
@settings(max_examples=400, deadline=None, database=None)
@given(st.sampled_from(sorted(SEEDS)), st.data())
def test_container_readers_answer_or_refuse(kind: str, data: st.DataObject) -> None:
    blob = data.draw(damaged(SEEDS[kind]))
    with contextlib.suppress(containers.ContainerError):
        info = READERS[kind](blob)
        assert info.width > 0 and info.height > 0
        if info.exif is not None:
            start, end = info.exif
            assert 0 <= start <= end <= len(blob)


def test_container_sizes_match_pillow() -> None:
    from io import BytesIO

    from PIL import Image

    for kind, blob in SEEDS.items():
        info = READERS[kind](blob)
        assert (info.width, info.height) == Image.open(BytesIO(blob)).size, kind


@settings(max_examples=500, deadline=None, database=None)
@given(st.binary(max_size=4096))
def test_exif_reader_never_raises(blob: bytes) -> None:
    assert 1 <= orientation.from_tiff(blob) <= 8
    assert 1 <= orientation.from_tiff(b"Exif\x00\x00" + blob) <= 8
    assert 1 <= orientation.of(blob) <= 8


@settings(max_examples=200, deadline=None, database=None)
@given(st.integers(0, 9), st.booleans(), st.integers(0, 600))
def test_exif_reader_finds_the_tag_within_its_entry_cap(
    value: int, big_endian: bool, at: int
) -> None:
    """Orientation at entry ``at`` of IFD0: read when within the cap and in range, else 1."""
    order = ">" if big_endian else "<"
    import struct

    entries = [struct.pack(order + "HHII", 0x9000, 7, 4, 0)] * at
    entries.append(struct.pack(order + "HHIHH", 0x0112, 3, 1, value, 0))
    block = (b"MM\x00*" if big_endian else b"II*\x00") + struct.pack(order + "I", 8)
    block += struct.pack(order + "H", len(entries)) + b"".join(entries) + b"\x00" * 4
    expected = value if 1 <= value <= 8 and at < orientation.MAX_ENTRIES else 1
    assert orientation.from_tiff(block) == expected


def test_ifd_bombs_cost_no_more_than_the_entry_cap() -> None:
    assert orientation.from_tiff(hostile.ifd_bomb()) == 1  # the tag is beyond the cap
    assert orientation.from_tiff(hostile.ifd_bomb(entries=10)) == 6


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=40,
)


@pytest.mark.slow
@settings(max_examples=500, deadline=None, database=None)
@given(json_values, st.integers(1, 8), st.integers(1, 30))
def test_the_item_scanner_agrees_with_a_full_parse(value: object, limit: int, chars: int) -> None:
    raw = json.dumps(value).encode()
    try:
        _scan_input(memoryview(raw), limit, chars)
    except LimitExceeded:
        assert isinstance(value, list | str)
        too_many = isinstance(value, list) and len(value) > limit
        assert too_many or _longest_string(value) - 2 > chars
        return
    except MalformedRequest:
        return
    parsed = msgspec.json.decode(raw)
    if isinstance(parsed, list):
        assert len(parsed) <= limit


def _longest_string(value: object) -> int:
    """The longest JSON-encoded string anywhere in ``value`` (keys included), quotes counted."""
    if isinstance(value, str):
        return len(json.dumps(value))
    if isinstance(value, list):
        return max((_longest_string(v) for v in value), default=0)
    if isinstance(value, dict):
        return max(
            (max(_longest_string(k), _longest_string(v)) for k, v in value.items()), default=0
        )
    return 0


@settings(max_examples=300, deadline=None, database=None)
@given(st.binary(max_size=512))
def test_the_item_scanner_never_raises_anything_else(blob: bytes) -> None:
    with contextlib.suppress(LimitExceeded, MalformedRequest):
        _scan_input(memoryview(b"[" + blob), 4, 10)


#: Bytes a hostile JSON body is made of: structure, escapes (surrogates among them), invalid
#: UTF-8 and ordinary text.
_JSON_PIECES = st.sampled_from(
    [b"[", b"]", b"{", b"}", b",", b":", b'"', b"\\", b"\\u", b"d800", b"dc00", b"\\ud83d",
     b"\\ude00", b"\\n", b"\xff", b"\xc3", b"\xed\xa0\x80", b"a", b"text", b"image", b" ", b"1"]
)  # fmt: skip


@settings(max_examples=500, deadline=None, database=None)
@given(st.lists(_JSON_PIECES, max_size=40))
def test_a_json_body_of_any_bytes_is_answered_by_a_4xx_kind(pieces: list[bytes]) -> None:
    """Whatever the bytes inside ``input`` (invalid UTF-8, lone or paired surrogates, broken
    structure), the parser answers with an error kind the edge maps to a 4xx, naming an item
    of the request when it names one."""
    raw = b'{"input": [' + b"".join(pieces) + b"]}"
    refused: MalformedRequest | InvalidFields | LimitExceeded | None = None
    try:
        parsed = parse_json(raw, 4, 1000)
    except (MalformedRequest, InvalidFields, LimitExceeded) as exc:
        refused = exc
    if refused is None:
        assert 1 <= len(parsed.items) <= 4
    else:
        assert refused.index is None or 0 <= refused.index <= 4
