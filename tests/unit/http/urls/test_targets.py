"""The one parse-and-normalise step of URL items (http/urls/targets.py), without any network: what
each class of string becomes or why it is refused, redirects resolved the same way, and, over
generated strings (hypothesis), that every string is either refused with a rule or becomes what it
reads back as: ASCII, no control character or space, a target httpcore and h11 send as it is."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable

import httpcore
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clip_gateway.errors import UrlRefused
from clip_gateway.http.urls.targets import MAX_URL_CHARS, Target, follow, parse

RULES = {"syntax", "scheme", "userinfo", "host", "port"}


@pytest.mark.parametrize(
    ("text", "url"),
    [
        ("https://Images.Example./a/b?c=d#frag", "https://images.example/a/b?c=d"),
        ("http://images.example:80", "http://images.example/"),
        ("http://images.example:/x", "http://images.example/x"),
        ("http://images.example:0080/x", "http://images.example/x"),
        ("https://images.example:8443/x", "https://images.example:8443/x"),
        (
            "http://b\u00fccher.example/\u00e4?q=\u00e4 b",
            "http://xn--bcher-kva.example/%C3%A4?q=%C3%A4%20b",
        ),
        (
            'http://x.example/a b<c>"d`e{f}|g^h',
            "http://x.example/a%20b%3Cc%3E%22d%60e%7Bf%7D%7Cg%5Eh",
        ),
        ("http://x.example/[a]", "http://x.example/%5Ba%5D"),
        ("http://x.example/100%.jpg?p=%zz&q=%2F", "http://x.example/100%25.jpg?p=%25zz&q=%2F"),
        ("http://x.example/a?b?c", "http://x.example/a?b?c"),
        ("http://x.example/?", "http://x.example/?"),
        ("http://2130706433/", "http://127.0.0.1/"),
        ("http://0x7f.1:8080/", "http://127.0.0.1:8080/"),
        ("http://\uff11\uff12\uff17\uff0e\uff10\uff0e\uff10\uff0e\uff11/", "http://127.0.0.1/"),
        ("http://[::FFFF:127.0.0.1]:81/", "http://[::ffff:7f00:1]:81/"),
        ("http://[2001:DB8::1]/", "http://[2001:db8::1]/"),
        ("http://under_score.example/", "http://under_score.example/"),
    ],
)
def test_a_url_becomes_exactly_what_is_fetched(text: str, url: str) -> None:
    assert parse(text).url == url


def test_the_parts_of_a_target() -> None:
    target = parse("https://[::1]:8443/a?b")
    assert target == Target("https", "::1", 8443, "/a?b", ipaddress.ip_address("::1"))
    assert target.authority == "[::1]:8443"
    assert parse("http://0177.1/").address == ipaddress.ip_address("127.0.0.1")
    assert parse("http://images.example/").address is None


@pytest.mark.parametrize(
    ("text", "rule", "says"),
    [
        ("ftp://x.example/", "scheme", "'ftp'"),
        ("//x.example/", "scheme", "only http and https"),
        ("http:x.example", "host", "no host"),
        ("http://u:p@x.example/", "userinfo", "credentials"),
        ("http://x.example\\@y.example/", "syntax", "backslash"),
        ("http://x.example/\x00", "syntax", "U+0000 at character 17"),
        ("http://x.example/\u2028", "host", ""),  # not a control: percent-encoded... see below
        ("http://[::1/", "host", "does not close"),
        ("http://::1/", "host", "in brackets"),
        ("http://[::1]x/", "host", "goes on after"),
        ("http://[1.2.3.4]/", "host", "not an IPv6 address"),
        ("http://[fe80::1%25eth0]/", "host", "zone id"),
        ("http://x%2eexample/", "host", "percent-encoding"),
        ("http://x..example/", "host", "empty label"),
        ("http://" + "a" * 64 + ".example/", "host", "64 characters"),
        ("http://" + "a." * 127 + "example/", "host", "261 characters"),
        ("http://x!.example/", "host", "'!'"),
        ("http://1.2.3.999/", "host", "ends in a number"),
        ("http://ex_\u00e4mple/", "host", "internationalised"),
        ("http://x.example:65536/", "port", "'65536'"),
        ("http://x.example:-1/", "port", "'-1'"),
        ("http://x.example:123456/", "port", "'123456'"),
        ("http://x.example/" + "a" * MAX_URL_CHARS, "syntax", "at most 8192"),
        ("http://x.example/?" + "\u00e4" * 2000, "syntax", "once percent-encoded"),
        ("http://x.example/\ud800", "syntax", "not a Unicode character"),
    ],
)
def test_what_cannot_be_fetched_exactly_is_refused_naming_the_rule(
    text: str, rule: str, says: str
) -> None:
    if text.endswith("\u2028"):  # a line separator in the path is a character like any other
        assert parse(text).target == "/%E2%80%A8"
        return
    with pytest.raises(UrlRefused) as refused:
        parse(text)
    assert refused.value.extra["rule"] == rule
    assert says in refused.value.reason and refused.value.reason.endswith(f"(rule: {rule})")


@pytest.mark.parametrize(
    ("location", "url"),
    [
        (b"/b?c", "http://x.example/b?c"),
        (b"c", "http://x.example/a/c"),
        (b"../d", "http://x.example/d"),
        (b"?q", "http://x.example/a/b?q"),
        (b"//y.example/e", "http://y.example/e"),
        (b"http:/f", "http://x.example/f"),  # same scheme, no authority: relative, as browsers
        (b"HTTPS://Y.example:443/g#h", "https://y.example/g"),
        (b"/\xc3\xa4", "http://x.example/%C3%A4"),  # UTF-8: the character, percent-encoded
        (b"/\xff\xfe", "http://x.example/%FF%FE"),  # not UTF-8: the very bytes
    ],
)
def test_a_location_is_resolved_against_the_url_then_read_as_a_url(
    location: bytes, url: str
) -> None:
    assert follow(parse("http://x.example/a/b"), location).url == url


@pytest.mark.parametrize(
    ("location", "rule"),
    [
        (b"", "syntax"),
        (b"  ", "syntax"),
        (b"/a\x01", "syntax"),
        (b"http://[::1", "syntax"),
        (b"http://\xff.example/", "host"),
        (b"ftp://y.example/", "scheme"),
        (b"http://y..example/", "host"),
    ],
)
def test_a_location_that_cannot_be_fetched_exactly_is_refused_as_a_redirect(
    location: bytes, rule: str
) -> None:
    with pytest.raises(UrlRefused) as refused:
        follow(parse("http://x.example/a"), location)
    assert refused.value.extra["rule"] == rule
    assert refused.value.reason.startswith("the server redirected to a URL that is not fetched")


#: Pieces of the strings that broke URL parsers before: brackets, escapes, dots, digits in
#: every script, IDNA's edge cases, controls, long labels, a raw byte a Location carried.
PIECES = st.sampled_from([
    "[", "]", ":", "@", "%", "%4", "%41", "%25", ".", "..", "\u3002", "\uff0e", "\\", "/", "?",
    "#", " ", "\t", "\r\n", "\x00", "\x7f", "\x85", "\u00e4", "\uff11", "\u0661", "\u200d",
    "0x", "0", "127", "1.2.3.4", "::", "ffff", "xn--", "xn--a", "-", "_", "a" * 63, "a" * 64,
    "[::1]", "[v1.x]", "%25lo", "\udcff", "\U0001f600", "localhost", ":80", ":65536", ":+1",
])  # fmt: skip
URLISH = st.builds(
    lambda scheme, parts: scheme + "".join(parts),
    st.sampled_from(["http://", "https://", "HTTP://", "http:", "http:/", "ftp://", ""]),
    st.lists(st.one_of(PIECES, st.text(max_size=4)), max_size=14),
)
#: URLs a client might well send: names in several scripts, addresses of both families in
#: decimal, any printable path and query.
LABEL = st.text(st.sampled_from([*"abcxyz019-_", "\u00e4", "\u00fc", "\uff11", "\u03b1"]),
                min_size=1, max_size=12)  # fmt: skip
HOST = st.one_of(
    st.lists(LABEL, min_size=1, max_size=4).map(".".join),
    st.ip_addresses().map(lambda a: f"[{a}]" if a.version == 6 else str(a)),
    st.integers(0, 2**32 - 1).map(str),
)
PRINTABLE = st.text(st.characters(blacklist_categories=("Cc", "Cs"), blacklist_characters="\\#"),
                    max_size=30)  # fmt: skip
VALIDISH = st.builds(
    lambda scheme, host, port, path, query: f"{scheme}{host}{port}/{path}{query}",
    st.sampled_from(["http://", "https://"]),
    HOST,
    st.sampled_from(["", ":8080", ":", ":443"]),
    PRINTABLE,
    st.one_of(st.just(""), PRINTABLE.map(lambda text: "?" + text)),
)
#: What h11 sends as a request target: no whitespace, no NUL.
_TARGET = re.compile(r"/[^\x00\s]*")


def _outcome(parsing: Callable[[], Target]) -> Target | UrlRefused:
    try:
        return parsing()
    except UrlRefused as refused:
        return refused


def _check(target: Target | UrlRefused) -> None:
    """A refusal names one of the rules; a target is what it reads back as, and sendable."""
    if isinstance(target, UrlRefused):
        assert target.extra["rule"] in RULES, target.reason
        return
    url = target.url
    assert url.isascii() and len(url) <= MAX_URL_CHARS
    assert _TARGET.fullmatch(target.target), target.target
    assert not set(target.host) & set("%[]@/\\ ?#"), target.host
    assert parse(url) == target  # what is fetched reads back as itself
    if target.address is not None:
        assert str(target.address) == target.host
    httpcore.URL(scheme=target.scheme.encode(), host=target.host.encode(), port=target.port,
                 target=target.target.encode())  # fmt: skip


@pytest.mark.slow
@settings(max_examples=600, deadline=None)
@given(st.one_of(URLISH, VALIDISH, st.text(max_size=80)))
def test_every_string_is_refused_with_a_rule_or_fetched_as_what_it_reads_back_as(text: str) -> None:
    _check(_outcome(lambda: parse(text)))


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(URLISH.map(lambda s: s.encode("utf-8", "surrogateescape")), st.binary(max_size=60))
)
def test_every_location_is_refused_with_a_rule_or_followed_to_what_it_reads_back_as(
    location: bytes,
) -> None:
    _check(_outcome(lambda: follow(parse("https://x.example:8443/a/b?c"), location)))
