"""The URL guard: which hosts and addresses a URL item may reach (docs/RELIABILITY.md "URL
items"). Pure: it parses and classifies, it never resolves or connects (http/fetch.py does,
asking it about every address it resolved, before connecting to that very address).

An address is refused when any form of it falls in a denied network: the address itself, and
the IPv4 address an IPv6 one carries (IPv4-mapped ``::ffff:a.b.c.d``, IPv4-compatible
``::a.b.c.d``, 6to4 ``2002::/16``, NAT64 ``64:ff9b::/96``, Teredo). A host that is an IPv4
address in any spelling ``inet_aton`` accepts (``2130706433``, ``0177.1``, ``0x7f.0.0.1``,
``127.1``) is normalised first, as the C library would read it. The operator's allowlist
(hostnames, or networks) lifts the deny list for what it names, nothing more.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass

from clip_gateway.errors import UrlRefused

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_V4, _V6 = ipaddress.IPv4Network, ipaddress.IPv6Network
#: The rule each denied network falls under, most specific first (the name a refusal gives).
DENIED: tuple[tuple[str, Network], ...] = (
    ("metadata", _V4("169.254.169.254/32")),
    ("metadata", _V6("fd00:ec2::254/128")),
    ("unspecified", _V4("0.0.0.0/8")),
    ("loopback", _V4("127.0.0.0/8")),
    ("private", _V4("10.0.0.0/8")),
    ("private", _V4("172.16.0.0/12")),
    ("private", _V4("192.168.0.0/16")),
    ("carrier-grade-nat", _V4("100.64.0.0/10")),
    ("link-local", _V4("169.254.0.0/16")),
    ("reserved", _V4("192.0.0.0/24")),  # IETF protocol assignments
    ("reserved", _V4("192.0.2.0/24")),  # documentation
    ("reserved", _V4("198.18.0.0/15")),  # benchmarking
    ("reserved", _V4("198.51.100.0/24")),
    ("reserved", _V4("203.0.113.0/24")),
    ("multicast", _V4("224.0.0.0/4")),
    ("reserved", _V4("240.0.0.0/4")),  # and the broadcast address
    ("unspecified", _V6("::/128")),
    ("loopback", _V6("::1/128")),
    ("unique-local", _V6("fc00::/7")),
    ("link-local", _V6("fe80::/10")),
    ("site-local", _V6("fec0::/10")),
    ("multicast", _V6("ff00::/8")),
    ("reserved", _V6("100::/64")),  # discard-only
    ("reserved", _V6("2001:db8::/32")),  # documentation
)
#: Which IPv6 networks carry an IPv4 address in their low 32 bits (checked as that address).
_NAT64 = (_V6("64:ff9b::/96"), _V6("64:ff9b:1::/48"))


def rule_of(address: Address) -> str | None:
    """The deny rule ``address`` falls under (any of its forms), or None: a public address."""
    forms = _forms(address)
    for form in forms:
        for rule, network in DENIED:
            if form.version == network.version and form in network:
                return rule
    for form in forms:
        if not form.is_global and form not in _NAT64[0]:
            return "reserved"  # whatever IANA has not made global since this table was written
    return None


def _forms(address: Address) -> list[Address]:
    """The address and every IPv4 address it embeds (mapped, compatible, 6to4, NAT64, Teredo)."""
    forms: list[Address] = [address]
    if isinstance(address, ipaddress.IPv6Address):
        low = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if address.ipv4_mapped is not None:
            forms.append(address.ipv4_mapped)
        if int(address) >> 32 == 0 and int(address) > 1:  # ::a.b.c.d, deprecated compatible
            forms.append(low)
        if address.sixtofour is not None:
            forms.append(address.sixtofour)
        if address.teredo is not None:
            forms.extend(address.teredo)
        if any(address in network for network in _NAT64):
            forms.append(low)
    return forms


def literal(host: str) -> Address | None:
    """The address ``host`` spells, or None: a name. IPv4 in every form ``inet_aton`` reads
    (decimal, octal, hex, one to four parts) as the C library would connect to it; IPv6 in
    brackets or not. A zone id (``fe80::1%eth0``) is refused: it names an interface."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if "%" in bare:
        raise UrlRefused("a URL host with an IPv6 zone id is not accepted (rule: link-local)")
    try:
        return ipaddress.ip_address(bare)
    except ValueError:
        pass
    if ":" in bare:
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(bare))
    except OSError:
        return None


@dataclass(frozen=True)
class Allowlist:
    """What the operator lets through the deny list (``GATEWAY_URL_ALLOW``)."""

    hosts: frozenset[str] = frozenset()
    networks: tuple[Network, ...] = ()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> Allowlist:
        hosts, networks = set(), []
        for entry in (e.strip() for e in entries):
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                hosts.add(entry.lower().rstrip("."))
        return cls(frozenset(hosts), tuple(networks))

    def allows(self, host: str, address: Address) -> bool:
        if host.lower().rstrip(".") in self.hosts:
            return True
        forms = _forms(address)
        return any(f.version == n.version and f in n for f in forms for n in self.networks)


def check(host: str, address: Address, allow: Allowlist, *, named: bool) -> None:
    """Refuse ``address`` (what ``host`` is, or resolved to) unless it is public or allowed.
    ``named``: the host is a name, so the refusal says what it resolves to by rule only."""
    if allow.allows(host, address):
        return
    rule = rule_of(address)
    if rule is None:
        return
    where = f"host {host!r} resolves to" if named else "the URL's host is"
    raise UrlRefused(
        f"{where} a {rule} address, which URL items may not reach (rule: {rule}); an operator "
        "can allow a host or network with GATEWAY_URL_ALLOW",
        rule=rule,
    )
