"""multipart/form-data as it streams in (RFC 7578): the one reader of a form. /v1/embeddings'
uploads (http/parsing.py), Immich's /predict (http/immich/form.py) and the look at Immich's form
that routes it (http/immich/passthrough.py, a reader with a stop) each say what they take from
a form as ``Fields``; this module walks the parts.

A part's body is the parser's own chunk when it arrives in one (most images do), else its
chunks joined once: never copied part by part. Each part is bounded while it streams in, by
its own limit (``Part.limit``, decided from its headers) or the form's (``Limits``), before it
is complete; the parser's own limits (parts, headers) hold too. The texts of a form are decoded
in the charset their part declares, from a short list (``CHARSETS``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from math import inf
from typing import Protocol, TypeVar

from multipart import MultipartSegment, ParserError, ParserLimitReached, PushMultipartParser

from clip_gateway.errors import EmbeddingError, MalformedRequest, UnsupportedFormat


class Part(Protocol):
    """What the reader knows of a part while its body streams in."""

    #: The most bytes its body may hold (None: only the form's ``Limits.part_bytes``).
    @property
    def limit(self) -> int | None: ...

    def too_large(self) -> EmbeddingError:
        """The refusal of a body over ``limit``, naming the part."""
        ...


P = TypeVar("P", bound=Part)


class Fields(Protocol[P]):
    """What a route takes from a form, part by part."""

    def begin(self, segment: MultipartSegment) -> P:
        """A part's headers are in: what it is and its limit (or its refusal, raised now, before
        its body is read)."""
        ...

    def end(self, part: P, data: bytes) -> bool:
        """A part is complete (``data``: its body): True when the form has what was wanted from
        it and the rest is not read."""
        ...

    def refused(self, exc: ParserError | ParserLimitReached) -> EmbeddingError | None:
        """The refusal of a body the parser cannot read (None: stop reading, quietly)."""
        ...


@dataclass(frozen=True)
class Limits:
    """The parser's own bounds on a form (the defaults are the parser's)."""

    #: Parts in the form.
    parts: float = inf
    #: Bytes of any one part's body.
    part_bytes: float = inf
    #: Header lines of one part.
    headers: int = 8


async def read_form(
    chunks: AsyncIterator[bytes], boundary: str, fields: Fields[P], limits: Limits
) -> None:
    """Walk the form in ``chunks`` (a body that ends with ``b""``; one that ends without it is
    cut short), telling ``fields`` of each part as its headers arrive and as it completes, until
    the form ends or ``fields`` has what it wanted."""
    parser = PushMultipartParser(
        boundary,
        max_header_count=limits.headers,
        max_segment_size=limits.part_bytes,
        max_segment_count=limits.parts,
    )
    part: P  # every body event follows its part's segment event
    # a part's body as the parser's chunks: most images arrive in one, kept as it is (one
    # bytes object joined alone is itself: no copy)
    pieces: list[bytes] = []
    size = 0
    try:
        async for chunk in chunks:
            for event in parser.parse(chunk):  # b"", the end of the body, ends the form
                if isinstance(event, MultipartSegment):
                    part = fields.begin(event)
                elif event is not None:
                    pieces.append(event)
                    size += len(event)
                    if part.limit is not None and size > part.limit:
                        raise part.too_large()
                else:
                    wanted = fields.end(part, b"".join(pieces))
                    pieces, size = [], 0
                    if wanted:
                        return
        parser.close()
    except (ParserError, ParserLimitReached) as exc:
        refusal = fields.refused(exc)
        if refusal is not None:
            raise refusal from exc


def malformed(exc: ParserError | ParserLimitReached) -> MalformedRequest:
    """The refusal of a body that is not a form the parser reads."""
    return MalformedRequest(f"malformed multipart body: {exc}")


#: Charsets a text or option part may declare (RFC 7578 section 4.4: the default is UTF-8),
#: by label, as the Python codec that decodes them: those real clients send. Others are 415:
#: Python's other codecs include some that raise bare ``UnicodeError`` (``idna``,
#: ``punycode``), some that take time quadratic in the input (``punycode``), and some that
#: yield lone surrogates no tokenizer takes (``utf-7``); every codec here decodes in one C pass
#: and yields only Unicode scalar values.
CHARSETS = {
    "utf-8": "utf-8",
    "utf8": "utf-8",
    "us-ascii": "ascii",
    "ascii": "ascii",
    "iso-8859-1": "latin-1",
    "iso8859-1": "latin-1",
    "iso_8859-1": "latin-1",
    "latin1": "latin-1",
    "latin-1": "latin-1",
    "windows-1252": "cp1252",
    "cp1252": "cp1252",
}
#: Bytes a character takes at most in any accepted charset (UTF-8; the others take one): a
#: text part longer than this many times the character limit cannot be within it.
MAX_BYTES_PER_CHAR = 4


def text_codec(charset: str | None, what: str, index: int | None = None) -> str:
    """The codec of a part's declared ``charset`` (UTF-8 when none), or 415 naming the part."""
    if charset is None:
        return "utf-8"
    codec = CHARSETS.get(charset.strip().lower())
    if codec is None:
        raise UnsupportedFormat(
            f"{what} declares charset {charset[:40]!r}; accepted: utf-8, us-ascii, iso-8859-1, "
            "windows-1252 (or no charset: UTF-8)",
            index=index,
        )
    return codec


def decode_text(data: bytes | bytearray, codec: str, what: str, index: int | None = None) -> str:
    """``data`` as text in ``codec`` (one of ``CHARSETS``'), or 400 naming the part and the
    byte where it stops being that charset."""
    try:
        return data.decode(codec)
    except UnicodeDecodeError as exc:
        raise MalformedRequest(
            f"{what} is not valid {codec} ({exc.reason} at byte {exc.start})", index=index
        ) from None
