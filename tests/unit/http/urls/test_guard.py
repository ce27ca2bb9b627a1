"""The URL guard's rules (http/urls/guard.py), without any network: every spelling of an IPv4
address the C library accepts, the IPv6 forms that carry one, and an allowlist that allows
exactly what it names."""

from __future__ import annotations

import ipaddress

import pytest

from clip_gateway.errors import UrlRefused
from clip_gateway.http.urls.guard import Allowlist, check, connected, ipv4, rule_of


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
        ("images.example", None),
        ("1.2.3.4.5", None),
        ("1.2.3.256", None),
    ],
)
def test_every_ipv4_spelling_is_read_as_the_c_library_reads_it(
    host: str, address: str | None
) -> None:
    found = ipv4(host)
    assert (str(found) if found else None) == address


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
    allow = Allowlist.parse(["127.0.0.1/32", "Images.Internal.", " ", "10.2.0.0/16", "Bücher.test"])
    check("x", ipaddress.ip_address("127.0.0.1"), allow, named=False)
    # a mapped address is the IPv4 one: a dual-stack socket connects to 127.0.0.1 over IPv4
    check("x", ipaddress.ip_address("::ffff:127.0.0.1"), allow, named=False)
    check("images.internal", ipaddress.ip_address("10.9.9.9"), allow, named=True)
    check("xn--bcher-kva.test", ipaddress.ip_address("10.9.9.9"), allow, named=True)
    check("x", ipaddress.ip_address("10.2.3.4"), allow, named=False)
    with pytest.raises(UrlRefused) as refused:
        check("other.internal", ipaddress.ip_address("10.9.9.9"), allow, named=True)
    assert refused.value.extra["rule"] == "private"
    assert "10.9.9.9" not in refused.value.reason  # the resolved address is never told


@pytest.mark.parametrize(
    "address",
    [
        "::127.0.0.1",  # IPv4-compatible: an IPv6 destination, not 127.0.0.1
        "2002:7f00:1::",  # 6to4 of 127.0.0.1: a whole /48 of other machines
        "2002:7f00:1:ffff::1",
        "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1: whatever the translator reaches
        "64:ff9b:1::7f00:1",
        "2001:0:4136:e378:8000:63bf:80ff:fffe",  # Teredo whose client is 127.0.0.1
    ],
)
def test_an_allowed_ipv4_address_does_not_allow_the_ipv6_ones_that_carry_it(address: str) -> None:
    allow = Allowlist.parse(["127.0.0.1/32"])
    with pytest.raises(UrlRefused) as refused:
        check("x", ipaddress.ip_address(address), allow, named=False)
    assert refused.value.extra["rule"] == "loopback"
    # listing the IPv6 network itself allows it
    check("x", ipaddress.ip_address(address), Allowlist.parse(["::/0"]), named=False)


def test_an_ipv4_mapped_network_allows_the_ipv4_network_it_maps() -> None:
    allow = Allowlist.parse(["::ffff:10.0.0.0/104"])
    assert allow.networks == (ipaddress.ip_network("10.0.0.0/8"),)
    check("x", ipaddress.ip_address("10.1.2.3"), allow, named=False)
    check("x", ipaddress.ip_address("::ffff:10.1.2.3"), allow, named=False)
    with pytest.raises(UrlRefused):
        check("x", ipaddress.ip_address("192.168.0.1"), allow, named=False)


def test_the_address_connected_to() -> None:
    assert str(connected(ipaddress.ip_address("::ffff:127.0.0.1"))) == "127.0.0.1"
    assert str(connected(ipaddress.ip_address("::127.0.0.1"))) == "::7f00:1"
    assert str(connected(ipaddress.ip_address("10.0.0.1"))) == "10.0.0.1"
