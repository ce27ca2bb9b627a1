"""The URL guard's parsing and rules (http/guard.py), without any network: every spelling of
an IPv4 address the C library accepts, the IPv6 forms that carry one, and the allowlist."""

from __future__ import annotations

import ipaddress

import pytest

from clip_gateway.errors import UrlRefused
from clip_gateway.http.guard import Allowlist, check, literal, rule_of


@pytest.mark.parametrize(
    ("host", "address"),
    [
        ("2130706433", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("0x7f.0.0.1", "127.0.0.1"),
        ("0x7F000001", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("127.0.1", "127.0.0.1"),
        ("0", "0.0.0.0"),
        ("[::1]", "::1"),
        ("::ffff:7f00:1", "::ffff:127.0.0.1"),
        ("images.example", None),
        ("1.2.3.4.5", None),
    ],
)
def test_every_spelling_of_an_address_is_read_as_the_c_library_reads_it(
    host: str, address: str | None
) -> None:
    found = literal(host)
    assert (str(found) if found else None) == (
        str(ipaddress.ip_address(address)) if address else None
    )


def test_a_zone_id_is_refused() -> None:
    with pytest.raises(UrlRefused):
        literal("[fe80::1%eth0]")


@pytest.mark.parametrize(
    ("address", "rule"),
    [
        ("8.8.8.8", None),
        ("2606:4700::1111", None),
        ("127.0.0.1", "loopback"),
        ("::ffff:169.254.169.254", "metadata"),
        ("::10.1.1.1", "private"),
        ("2002:c0a8:101::", "private"),  # 6to4 of 192.168.1.1
        ("64:ff9b::7f00:1", "loopback"),  # NAT64 of 127.0.0.1
        ("64:ff9b::808:808", None),  # NAT64 of a public address
        ("100.127.255.255", "carrier-grade-nat"),
        ("fd12::1", "unique-local"),
        ("fe80::1", "link-local"),
        ("198.18.0.1", "reserved"),
    ],
)
def test_rules(address: str, rule: str | None) -> None:
    assert rule_of(ipaddress.ip_address(address)) == rule


def test_the_allowlist_lifts_the_deny_list_for_what_it_names_only() -> None:
    allow = Allowlist.parse(["127.0.0.1/32", "Images.Internal.", " ", "10.2.0.0/16"])
    check("x", ipaddress.ip_address("127.0.0.1"), allow, named=False)
    check("x", ipaddress.ip_address("::ffff:127.0.0.1"), allow, named=False)
    check("images.internal", ipaddress.ip_address("10.9.9.9"), allow, named=True)
    check("x", ipaddress.ip_address("10.2.3.4"), allow, named=False)
    with pytest.raises(UrlRefused) as refused:
        check("other.internal", ipaddress.ip_address("10.9.9.9"), allow, named=True)
    assert refused.value.extra["rule"] == "private"
    assert "10.9.9.9" not in refused.value.reason  # the resolved address is never told
