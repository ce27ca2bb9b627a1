"""The one form reader (http/forms.py): parts walked in order, each bounded while it streams in,
a part's body the parser's own chunk when it arrives in one, a stop that reads no further, the
parser's refusals handed to the fields; and the form's text charsets. Also: it is the only
part-walking loop in the gateway."""

from __future__ import annotations

import ast
import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import multipart
import pytest
from multipart import MultipartSegment, ParserError, ParserLimitReached

from clip_gateway.errors import EmbeddingError, LimitExceeded, MalformedRequest, UnsupportedFormat
from clip_gateway.http import forms

ROOT = Path(__file__).resolve().parents[3]
BOUNDARY = "b0undary"


def form(*parts: tuple[str, bytes], headers: str = "") -> bytes:
    out = b""
    for name, data in parts:
        head = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n{headers}\r\n'
        out += head.encode() + data + b"\r\n"
    return out + f"--{BOUNDARY}--\r\n".encode()


@dataclass
class Read:
    """A body's chunks as a client sends them, counting how many the reader took."""

    chunks: list[bytes]
    taken: int = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            self.taken += 1
            yield chunk


def cut(data: bytes, size: int) -> Read:
    return Read([data[i : i + size] for i in range(0, len(data), size)] + [b""])


@dataclass(frozen=True)
class Named:
    name: str | None
    limit: int | None = None

    def too_large(self) -> LimitExceeded:
        return LimitExceeded(f"{self.name} is over {self.limit} bytes", limit=self.limit)


@dataclass
class Recorder:
    """Fields that keep every part, each name limited as ``limits`` says; stop after ``stop``."""

    limits: dict[str, int] = field(default_factory=dict)
    stop: str | None = None
    quiet: bool = False
    parts: list[tuple[str | None, bytes]] = field(default_factory=list)
    begun: list[str | None] = field(default_factory=list)
    refusals: list[Exception] = field(default_factory=list)

    def begin(self, segment: MultipartSegment) -> Named:
        self.begun.append(segment.name)
        return Named(segment.name, self.limits.get(segment.name or ""))

    def end(self, part: Named, data: bytes) -> bool:
        self.parts.append((part.name, data))
        return part.name == self.stop

    def refused(self, exc: ParserError | ParserLimitReached) -> EmbeddingError | None:
        self.refusals.append(exc)
        return None if self.quiet else forms.malformed(exc)


def read(body: Read, fields: Recorder, limits: forms.Limits | None = None) -> None:
    asyncio.run(forms.read_form(body, BOUNDARY, fields, limits or forms.Limits()))


@pytest.mark.parametrize("size", [1, 7, 4096])
def test_parts_come_whole_and_in_order_however_the_body_is_cut(size: int) -> None:
    fields = Recorder()
    read(cut(form(("a", b"first"), ("b", b""), ("c", b"x" * 100)), size), fields)
    assert fields.parts == [("a", b"first"), ("b", b""), ("c", b"x" * 100)]
    assert fields.begun == ["a", "b", "c"]


class Spy(multipart.PushMultipartParser):
    """The parser, keeping every body chunk it hands out."""

    seen: ClassVar[list[bytes]] = []

    def parse(self, chunk):  # type: ignore[no-untyped-def]
        for event in super().parse(chunk):
            if isinstance(event, bytes):
                Spy.seen.append(event)
            yield event


def test_a_part_that_arrives_in_one_chunk_is_the_parsers_own_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No copy per part: the body handed to ``end`` is the very object the parser made; a part
    in several pieces is joined once."""
    monkeypatch.setattr(forms, "PushMultipartParser", Spy)
    Spy.seen = []
    fields = Recorder()
    read(cut(form(("one", b"x" * 1000)), 1 << 16), fields)
    assert len(Spy.seen) == 1 and fields.parts[0][1] is Spy.seen[0]
    Spy.seen = []
    read(cut(form(("many", b"y" * 1000)), 100), fields)
    assert len(Spy.seen) > 1 and fields.parts[1] == ("many", b"".join(Spy.seen))


def test_a_part_over_its_own_limit_is_refused_while_it_streams_in() -> None:
    fields = Recorder(limits={"b": 10})
    body = cut(form(("a", b"ok"), ("b", b"x" * 11), ("c", b"never read")), 8)
    with pytest.raises(LimitExceeded) as raised:
        read(body, fields)
    assert raised.value.reason == "b is over 10 bytes"
    assert fields.parts == [("a", b"ok")]  # b never completes, c never begins
    assert body.taken < len(body.chunks) - 1
    # exactly at the limit, first or after other parts, in one chunk or several
    for parts in ([("b", b"x" * 10)], [("a", b"12345"), ("b", b"x" * 10)]):
        for size in (8, 4096):
            exact = Recorder(limits={"b": 10})
            read(cut(form(*parts), size), exact)
            assert exact.parts == parts


def test_the_form_limits_are_the_parsers() -> None:
    limits = forms.Limits(parts=2, part_bytes=10, headers=2)
    fields = Recorder()
    read(cut(form(("a", b"x" * 10), ("b", b"")), 5), fields, limits)
    assert len(fields.parts) == 2
    for body in (
        form(("a", b""), ("b", b""), ("c", b"")),  # a third part
        form(("a", b"x" * 11)),  # a part over part_bytes
        form(("a", b""), headers="X-1: a\r\nX-2: b\r\n"),  # three header lines
    ):
        over = Recorder()
        with pytest.raises(MalformedRequest):
            read(cut(body, 5), over, limits)
        assert isinstance(over.refusals[0], ParserLimitReached)
    assert forms.Limits() == forms.Limits(parts=float("inf"), part_bytes=float("inf"), headers=8)


def test_a_stop_reads_no_further() -> None:
    fields = Recorder(stop="entries")
    body = cut(form(("entries", b"{}"), ("image", b"x" * 1000)), 64)
    read(body, fields)
    assert fields.parts == [("entries", b"{}")]
    assert body.taken == 2  # the chunk that completed entries, then nothing more


def test_what_the_parser_cannot_read_is_the_fields_to_refuse() -> None:
    for body in (
        Read([f"--{BOUNDARY}\r\nbroken".encode(), b""]),  # not a form
        Read([form(("a", b"x"))[:-10]]),  # cut short: no b"" and no closing boundary
    ):
        fields = Recorder()
        with pytest.raises(MalformedRequest, match=r"^malformed multipart body: ") as raised:
            read(body, fields)
        assert raised.value.__cause__ is fields.refusals[0]
        quiet = Recorder(quiet=True)
        read(Read(list(body.chunks)), quiet)  # refused quietly: nothing raised
        assert isinstance(quiet.refusals[0], ParserError)


def test_charsets_are_a_short_list_and_utf8_by_default() -> None:
    assert forms.text_codec(None, "part") == "utf-8"
    assert forms.text_codec(" Windows-1252 ", "part") == "cp1252"
    assert forms.text_codec("ISO_8859-1", "part") == "latin-1"
    with pytest.raises(UnsupportedFormat) as raised:
        forms.text_codec("utf-7", "input[2] (form field 'text')", 2)
    assert raised.value.index == 2
    assert raised.value.reason.startswith("input[2] (form field 'text') declares charset 'utf-7'")
    assert forms.decode_text(b"caf\xe9", "latin-1", "part") == "café"
    with pytest.raises(MalformedRequest) as bad:
        forms.decode_text(b"caf\xe9", "utf-8", "form field 'text'")
    assert bad.value.reason == (
        "form field 'text' is not valid utf-8 (unexpected end of data at byte 3)"
    )


@pytest.mark.slow
def test_the_form_reader_is_the_only_part_walking_loop() -> None:
    """No module of the gateway but http/forms.py runs the multipart parser."""
    parsers = {"PushMultipartParser", "MultipartParser", "parse_form_data"}
    walkers = set()
    for path in sorted((ROOT / "clip_gateway").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = {getattr(node, attr, None) for attr in ("id", "attr", "name")}
            if isinstance(node, ast.Name | ast.Attribute | ast.alias) and names & parsers:
                walkers.add(path.relative_to(ROOT).as_posix())
    assert sorted(walkers) == ["clip_gateway/http/forms.py"]
