"""Every byte sequence and charset a client chooses ends in a 4xx problem naming the item (issue
31): invalid UTF-8 inside JSON strings, lone surrogates, and multipart text or option parts in
charsets the gateway does not take (some of Python's codecs raise bare ``UnicodeError``, are
quadratic, or yield lone surrogates that the tokenizers refuse with ``TypeError``)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from litestar.testing import TestClient

from clip_gateway.config.settings import ServerSettings
from clip_gateway.http.app import create_app
from clip_gateway.http.forms import CHARSETS
from tests.api.test_bad_input import problem
from tests.api.test_immich import NAME, TEXTUAL
from tests.fakes import FakeBackend

BOUNDARY = "b0undary"
JSON_TYPE = {"content-type": "application/json"}


def post_json(client: TestClient, raw: bytes):
    return client.post("/v1/embeddings", content=raw, headers=JSON_TYPE)


@pytest.mark.parametrize(
    ("raw", "index"),
    [
        (b'{"input": "a \xff"}', 0),
        (b'{"input": ["fine", "a \xff"]}', 1),
        (b'{"input": ["fine", "caf\xc3\xa9", {"text": "\xc3"}]}', 2),  # truncated sequence
        (b'{"input": ["\xed\xa0\x80"]}', 0),  # a surrogate encoded as UTF-8 (CESU-8)
        (b'{"input": ["ok", "\xf4\x90\x80\x80 past U+10FFFF"], "model": "x"}', 1),
        (b'{"input": ["ok", {"image": "data:image/png;base64,\xc0\xaf"}]}', 1),  # overlong
    ],
)
def test_invalid_utf8_in_a_json_string_is_a_400_naming_the_item(
    client: TestClient, raw: bytes, index: int
) -> None:
    body = problem(post_json(client, raw), 400, "invalid-request", index)
    assert f"input[{index}] is not valid UTF-8" in body["detail"]
    assert "RFC 8259" in body["detail"]


def test_invalid_utf8_outside_input_is_a_400_saying_where(client: TestClient) -> None:
    body = problem(post_json(client, b'{"model": "\xff", "input": ["a"]}'), 400, "invalid-request")
    assert "not valid UTF-8 (byte 11)" in body["detail"]


@pytest.mark.parametrize(
    ("raw", "index"),
    [
        (b'{"input": ["' + b"\\ud83d\\ude00" * 2000 + b'", "x\\ud800"]}', 1),  # pairs first
        (b'{"input": ["\\\\ud800 is text", {"image": "\\udfff"}]}', 1),  # an escaped backslash
        (b'{"modality": "text", "input": ["a", "b", "\\ud800\\ud800"]}', 2),
    ],
)
def test_lone_surrogates_among_pairs_and_lookalikes_name_the_item(
    client: TestClient, raw: bytes, index: int
) -> None:
    body = problem(post_json(client, raw), 400, "invalid-request", index)
    assert "lone UTF-16 surrogate" in body["detail"]


def part(name: str, data: bytes, content_type: str | None = None) -> bytes:
    head = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n'
    if content_type:
        head += f"Content-Type: {content_type}\r\n"
    return head.encode() + b"\r\n" + data + b"\r\n"


def post_form(client: TestClient, *parts: bytes, path: str = "/v1/embeddings"):
    return client.post(
        path,
        content=b"".join(parts) + f"--{BOUNDARY}--\r\n".encode(),
        headers={"content-type": f"multipart/form-data; boundary={BOUNDARY}"},
    )


#: Charsets no client sends, each for a reason: bare UnicodeError, quadratic decode, lone
#: surrogates, not a text codec at all, or no such codec.
REFUSED = ["undefined", "idna", "punycode", "utf-7", "utf-16", "rot13", "hex", "x-nonsense",
           "utf-8-sig", "iso-8859-2"]  # fmt: skip


@pytest.mark.parametrize("charset", REFUSED)
def test_a_text_part_in_a_charset_not_taken_is_a_415_naming_it(
    client: TestClient, charset: str
) -> None:
    reply = post_form(
        client,
        part("text", b"a cat"),
        part("text", b"+2AA-", f"text/plain; charset={charset}"),
    )
    body = problem(reply, 415, "unsupported-media-type", 1)
    assert "input[1] (form field 'text') declares charset" in body["detail"]
    assert "accepted: utf-8, us-ascii, iso-8859-1, windows-1252" in body["detail"]


def test_an_option_part_in_a_charset_not_taken_is_a_415_naming_the_field(
    client: TestClient,
) -> None:
    reply = post_form(
        client, part("text", b"a cat"), part("model", b"x", "text/plain; charset=idna")
    )
    body = problem(reply, 415, "unsupported-media-type")
    assert "form field 'model' declares charset 'idna'" in body["detail"]


@pytest.mark.parametrize(
    ("charset", "data"),
    [("US-ASCII", b"caf\xe9"), ("windows-1252", b"caf\x81"), ("utf-8", b"caf\xed\xa0\x80")],
)
def test_bytes_that_are_not_their_declared_charset_are_a_400_naming_the_part(
    client: TestClient, charset: str, data: bytes
) -> None:
    reply = post_form(
        client, part("text", b"ok"), part("text", data, f"text/plain; charset={charset}")
    )
    body = problem(reply, 400, "invalid-request", 1)
    assert (
        f"input[1] (form field 'text') is not valid {CHARSETS[charset.lower()]}" in body["detail"]
    )
    assert "at byte 3" in body["detail"]


@pytest.mark.parametrize(
    ("charset", "data"),
    [
        ("ISO-8859-1", "café".encode("latin-1")),
        ("latin1", "café".encode("latin-1")),
        ("windows-1252", "café “quoted”".encode("cp1252")),
        ("us-ascii", b"cafe"),
        ("UTF-8", "café".encode()),
        (None, "café".encode()),
    ],
)
def test_the_charsets_real_clients_send_are_texts(
    client: TestClient, charset: str | None, data: bytes
) -> None:
    content_type = f"text/plain; charset={charset}" if charset else None
    reply = post_form(client, part("text", data, content_type))
    assert reply.status_code == 200, reply.text[:300]
    assert reply.json()["usage"]["texts"] == 1


def test_a_text_part_is_bounded_before_it_is_decoded(
    client: TestClient, settings: ServerSettings
) -> None:
    """Four bytes per character at most in any charset taken: a longer part cannot be within
    the character limit and is refused while it streams in, never decoded."""
    limit = settings.max_text_chars * 4
    body = problem(post_form(client, part("text", b"a" * (limit + 1))), 413, "payload-too-large", 0)
    assert f"input[0] (form field 'text') is over {limit} bytes" in body["detail"]
    model = problem(post_form(client, part("text", b"a"), part("model", b"m" * 5000)), 413,
                    "payload-too-large")  # fmt: skip
    assert "form field 'model' is over 4096 bytes" in model["detail"]


@pytest.fixture
def immich(settings: ServerSettings, fake: FakeBackend) -> Iterator[TestClient]:
    on = settings.model_copy(update={"immich": True, "immich_aliases": (NAME,)})
    with TestClient(create_app(on, lambda *_: fake)) as client:
        yield client


@pytest.mark.parametrize("charset", ["utf-7", "punycode", "undefined", "idna"])
def test_predict_refuses_a_text_in_a_charset_not_taken(immich: TestClient, charset: str) -> None:
    reply = post_form(
        immich,
        part("entries", json.dumps(TEXTUAL).encode()),
        part("text", b"+2AA-", f"text/plain; charset={charset}"),
        path="/predict",
    )
    body = problem(reply, 415, "unsupported-media-type")
    assert f"form field 'text' declares charset '{charset}'" in body["detail"]


def test_predict_refuses_entries_that_are_not_utf8(immich: TestClient) -> None:
    entries = json.dumps(TEXTUAL).replace(NAME, "caf\xe9").encode("latin-1")
    reply = post_form(immich, part("entries", entries), part("text", b"a cat"), path="/predict")
    body = problem(reply, 422, "unprocessable-request")
    assert "`entries` is not valid UTF-8" in body["detail"]
