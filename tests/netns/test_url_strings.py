"""Every URL string and every redirect a server sends gets a per-item 4xx naming it, never a
5xx; the allowlist allows exactly what it names; nothing is fetched for a request that is
refused anyway (issue 42). Against a real gateway process (the fake model) in the namespace:
the client's strings, then the same classes as an allowed server's ``Location``.

Before the fix, 15 of the client's strings here and 5 of the Locations were a 500 for the
whole request, skip_invalid or not (each case says what main answered); the IPv6 forms that
carry 127.0.0.1 were connected to with only 127.0.0.1/32 allowed; and the refused requests had
fetched their URLs first."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from clip_gateway.config.processes import GatewayProcess
from tests.netns.images import Images, gateway, serving

#: A good image item before the one under test (index 0; the URL is index 1).
GOOD = "{S}/img/1"


@pytest.fixture(scope="module")
def server() -> Iterator[Images]:
    with serving() as images:
        yield images


@pytest.fixture(scope="module")
def process(
    tmp_path_factory: pytest.TempPathFactory, clip_tokenizer_file: Path
) -> Iterator[GatewayProcess]:
    log = tmp_path_factory.mktemp("strings")
    with gateway(log, str(clip_tokenizer_file), GATEWAY_URL_TIMEOUT_S="2",
                 GATEWAY_URL_CONNECT_TIMEOUT_S="1") as running:  # fmt: skip
        yield running


def post(process: GatewayProcess, *items: object, **options: object) -> httpx.Response:
    return httpx.post(f"{process.url}/v1/embeddings",
                      json={"input": list(items), **options}, timeout=30)  # fmt: skip


def filled(text: str, server: Images) -> str:
    return text.replace("{S}", server.url).replace("{P}", str(server.server_address[1]))


#: (URL, the rule it is refused by), and in a comment what main answered (without skip_invalid)
#: where it was not already this refusal.
REFUSED = [
    ("http://[127.0.0.1/x", "host"),  # 500
    ("http://127.0.0.1]/x", "host"),  # 500
    ("http://[::1]]/x", "host"),  # 422 loopback: the ']' read as part of the host
    ("http://[127.0.0.1]/x", "host"),  # 500
    ("http://[v1.fe]/x", "host"),  # IPvFuture: 422 dns
    ("http://[fe80::1%25lo]:{P}/x", "host"),  # 422 without a rule
    ("http://a..b/x", "host"),  # 500
    ("http://.a.test/x", "host"),  # 500
    ("http://" + "a" * 64 + ".test/x", "host"),  # 500
    ("http://" + "a." * 127 + "test/x", "host"),  # 255 characters: 422 dns
    ("http://" + "a" * 5000 + "/x", "host"),  # 500
    ("http://a\x00b.test/x", "syntax"),  # 500
    ("{S}/img/1\x00", "syntax"),  # the control characters: 422 LocalProtocolError, after
    ("{S}/img/1\r\nX-Injected: 1", "syntax"),  # resolving and connecting
    ("{S}/img/1\tx", "syntax"),
    ("{S}/img/1\x7f", "syntax"),
    ("{S}/img/1\x85", "syntax"),  # 500
    ("http://127.0.0.1:{P}\\@evil.test/img/1", "syntax"),  # 422 userinfo
    ("{S}\\img/1", "syntax"),  # 422 port
    ("http://exa mple.test/x", "host"),  # 422 dns
    ("http://%31%32%37.0.0.1:{P}/img/1", "host"),  # 422 "an IPv6 zone id"
    ("http://ex_\u00e4.test/x", "host"),  # IDNA refuses '_': 422 dns
    ("http://\u0661\u0662\u0667.0.0.1/x", "host"),  # Arabic-Indic digits: 422 dns
    ("http://" + "\u00e4" * 70 + ".test/x", "host"),  # 500
    ("http://1.2.3.256/x", "host"),  # ends in a number, not an address: 422 dns
    ("http://1.2.3.4.5/x", "host"),  # 422 dns
    ("http://127.0.0.1:{P}:80/x", "host"),  # 422 port
    ("http://127.0.0.1:\u0668\u0660/x", "port"),
    ("http://127.0.0.1:+80/x", "port"),
    ("http://127.0.0.1:0/x", "port"),  # 422 ConnectError
    ("http://127.0.0.1:65536/x", "port"),
    ("http://127.0.0.1:" + "0" * 5000 + "80/x", "port"),
    ("http://user@127.0.0.1:{P}/img/1", "userinfo"),
    ("http://@127.0.0.1:{P}/img/1", "userinfo"),
    ("https:///x", "host"),
    ("http://:80/x", "host"),
    ("{S}/" + "a" * 9000, "syntax"),  # 422 from the server's closing
    ("{S}/img/1?" + "\u00e4" * 3000, "syntax"),  # 18 KB once percent-encoded: 500
    # the IPv6 forms that carry the allowed 127.0.0.1 are other machines: refused by the deny
    # list, not allowed by 127.0.0.1/32 (main connected to them: 422 ConnectError here, as the
    # namespace has no route to them)
    ("http://[::127.0.0.1]:{P}/img/1", "loopback"),
    ("http://[2002:7f00:1::]:{P}/img/1", "loopback"),
    ("http://[2002:7f00:1:ffff::1]:{P}/img/1", "loopback"),
    ("http://[64:ff9b::127.0.0.1]:{P}/img/1", "loopback"),
    ("http://[2001:0:4136:e378:8000:63bf:80ff:fffe]:{P}/img/1", "loopback"),
]


@pytest.mark.parametrize(("url", "rule"), REFUSED)
def test_a_url_that_cannot_be_fetched_exactly_is_a_4xx_naming_it(
    process: GatewayProcess, server: Images, url: str, rule: str
) -> None:
    url = filled(url, server)
    server.reset()
    refused = post(process, {"image": filled(GOOD, server)}, {"image": url})
    assert refused.status_code == 422, refused.text[:500]
    body = refused.json()
    assert body["type"].endswith("/url-refused") and body["rule"] == rule
    assert body["index"] == 1 and body["detail"].startswith("input[1]")
    assert server.paths == []  # every URL is read before any is fetched
    skipped = post(process, {"image": filled(GOOD, server)}, {"image": url}, skip_invalid=True)
    assert skipped.status_code == 200, skipped.text[:500]
    answer = skipped.json()
    assert [row["index"] for row in answer["data"]] == [0]
    assert [(e["index"], e["status"]) for e in answer["errors"]] == [(1, 422)]


#: (URL, the request path the server sees): each fetched as exactly that.
FETCHED = [
    ("{S}/img/1?q=\u00e4", "/img/1?q=%C3%A4"),  # was a 500
    ('{S}/img/1?q=a b&r=<">', "/img/1?q=a%20b&r=%3C%22%3E"),
    ("{S}/img/1?q=100%", "/img/1?q=100%25"),
    ("{S}/img/1?q=%41", "/img/1?q=%41"),
    ("{S}/img/1#\u00e4", "/img/1"),  # the fragment is never sent (was a 500)
    (
        "http://\uff11\uff12\uff17\uff0e\uff10\uff0e\uff10\uff0e\uff11:{P}/img/1",
        "/img/1",
    ),  # was a 500
    ("http://127\u30020\u30020\u30021:{P}/img/1", "/img/1"),  # ideographic full stops: was a 500
    ("http://IMAGES.TEST.:{P}/img/1", "/img/1"),  # was 422 dns
    ("http://0x7f.1:{P}/img/1", "/img/1"),
    ("http://[::ffff:127.0.0.1]:{P}/img/1", "/img/1"),  # mapped: connects to 127.0.0.1
    ("HTTP://127.0.0.1:{P}/img/1", "/img/1"),
]


@pytest.mark.parametrize(("url", "path"), FETCHED)
def test_a_url_normalised_exactly_is_fetched_as_that(
    process: GatewayProcess, server: Images, url: str, path: str
) -> None:
    server.reset()
    response = post(process, {"image": filled(GOOD, server)}, {"image": filled(url, server)})
    assert response.status_code == 200, response.text[:500]
    # both items are fetched at once: either may reach the server last
    assert sorted(server.paths) == sorted(["/img/1", path])


#: (Location bytes, the rule it is refused by; None: it is followed and fetched), and in a
#: comment what main answered where it was not already this.
LOCATIONS: list[tuple[bytes, str | None]] = [
    (b"/img/\xc3\xa4", "404"),  # followed as /img/%C3%A4: 500
    (b"/img/\xff", "404"),  # not UTF-8: the byte itself, percent-encoded: 500
    (b"http://[127.0.0.1/x", "syntax"),  # 500
    (b"http://a..b/x", "host"),  # 500
    (b"http://" + b"a" * 64 + b".test/x", "host"),  # 500
    (b"http://\xff.test/x", "host"),  # 422 dns
    (b"http://ex\xc3\xa4mple.test/x", "dns"),  # IDNA's name, which this namespace cannot resolve
    (b"/img/1\x01", "syntax"),  # 422 LocalProtocolError
    (b"/img\\1", "syntax"),  # 422 LocalProtocolError
    (b"", "syntax"),  # 422 redirects: the same URL again, four times
    (b"http://127.0.0.1:99999/x", "port"),
    (b"ftp://127.0.0.1/x", "scheme"),
    (b"http://10.0.0.1/img/1", "private"),
    (b"http://[::127.0.0.1]:{P}/img/1", "loopback"),  # connected to: 422 ConnectError
    (b"http://[64:ff9b::7f00:1]:{P}/img/1", "loopback"),  # connected to: 422 ConnectError
    (b"//[::ffff:127.0.0.1]:{P}/img/2", None),
    (b"/img/3", None),
    (b"http:/img/4", None),  # a same-scheme reference without authority: relative
    (b"//127.0.0.1:{P}/img/5#frag", None),
    (b"http://127.0.0.1:{P}/img/6", None),
]


@pytest.mark.parametrize(("location", "rule"), LOCATIONS)
def test_a_redirect_from_an_allowed_server_is_read_as_the_clients_url_is(
    process: GatewayProcess, server: Images, location: bytes, rule: str | None
) -> None:
    location = location.replace(b"{P}", str(server.server_address[1]).encode())
    url = f"{server.url}/loc?{location.hex()}"
    for skip in (False, True):
        response = post(process, {"image": filled(GOOD, server)}, {"image": url},
                        skip_invalid=skip)  # fmt: skip
        assert response.status_code < 500, response.text[:500]
        body: dict[str, Any] = response.json()
        if rule is None:
            assert response.status_code == 200 and len(body["data"]) == 2, response.text[:500]
            continue
        problem = body if not skip else body["errors"][0]
        if skip:
            assert response.status_code == 200 and [r["index"] for r in body["data"]] == [0]
        else:
            assert response.status_code == 422
            assert body.get("rule") == rule or body.get("upstream_status") == int(rule)
        assert problem["index"] == 1 and problem["detail"].startswith("input[1]")
        if rule not in ("404", "dns", "private", "loopback"):
            assert "redirected" in problem["detail"]


@pytest.mark.parametrize(
    ("options", "extra", "status"),
    [
        ({"model": "another-model"}, None, 404),
        ({"dimensions": 7}, None, 400),
        ({"encoding_format": "int8"}, None, 422),
        ({}, "x" * 5000, 413),  # a text over GATEWAY_MAX_TEXT_CHARS
        ({}, "   ", 422),  # an empty text
        ({}, {"image": "http://a..b/"}, 422),  # a URL after it that cannot be fetched
    ],
)
def test_nothing_is_fetched_for_a_request_refused_anyway(
    process: GatewayProcess, server: Images, options: dict[str, object], extra: object, status: int
) -> None:
    server.reset()
    items = [{"image": f"{server.url}/img/2"}, *([extra] if extra is not None else [])]
    response = post(process, *items, **options)
    assert response.status_code == status, response.text[:300]
    assert server.paths == []
