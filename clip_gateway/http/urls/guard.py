"""The URL guard: which hosts and addresses a URL item may reach (docs/RELIABILITY.md "URL items").
Pure: it classifies, it never resolves or connects (http/urls/targets.py parses the URL first;
http/urls/fetch.py resolves, asks it about every address found, and connects to that very address).

An address is refused when any form of it falls in a denied network: the address itself, and
the IPv4 address an IPv6 one carries (IPv4-mapped ``::ffff:a.b.c.d``, IPv4-compatible
``::a.b.c.d``, 6to4 ``2002::/16``, NAT64 ``64:ff9b::/96``, Teredo). A host that is an IPv4
address in any spelling ``inet_aton`` accepts (``2130706433``, ``0177.1``, ``0x7f.0.0.1``,
``127.1``) is read as the C library would read it. The operator's allowlist lifts the deny list
for exactly what it names: a host name it lists, or an address inside a network it lists, in
that network's own family. The address that counts is the one connected to (``connected``: an
IPv4-mapped address is its IPv4 address, which is where a dual-stack socket goes); an IPv6
address that merely carries an allowed IPv4 one (compatible, 6to4, NAT64, Teredo) is another
machine, allowed only when an IPv6 network listed holds it.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass

import idna

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


def ipv4(host: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address ``host`` spells, as the C library reads it (``inet_aton``: decimal,
    octal, hex, one to four parts), or None."""
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except (OSError, UnicodeError, ValueError):
        return None


def connected(address: Address) -> Address:
    """The address a connection to ``address`` reaches: an IPv4-mapped IPv6 address is its IPv4
    one (a dual-stack socket connects to that over IPv4), any other is itself."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


@dataclass(frozen=True)
class Allowlist:
    """What the operator lets through the deny list (``GATEWAY_URL_ALLOW``): host names, and
    networks; an address is allowed by a network of its own family that holds it."""

    hosts: frozenset[str] = frozenset()
    networks: tuple[Network, ...] = ()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> Allowlist:
        hosts, networks = set(), []
        for entry in (e.strip() for e in entries):
            if not entry:
                continue
            try:
                networks.append(_own_family(ipaddress.ip_network(entry, strict=False)))
            except ValueError:
                hosts.add(_name(entry))
        return cls(frozenset(hosts), tuple(networks))

    def allows(self, host: str, address: Address) -> bool:
        """``host`` (a name as http/urls/targets.py wrote it) is listed, or the address connected to
        for ``address`` is in a listed network of its family; never by an IPv4 address an
        IPv6 one carries."""
        if host in self.hosts:
            return True
        reached = connected(address)
        return any(reached.version == n.version and reached in n for n in self.networks)


def _own_family(network: Network) -> Network:
    """An IPv4-mapped network (``::ffff:10.0.0.0/104``) as the IPv4 network it maps, which is
    what connecting to its addresses reaches; any other as it is."""
    mapped = network.network_address
    if isinstance(mapped, ipaddress.IPv6Address) and mapped.ipv4_mapped and network.prefixlen >= 96:
        return ipaddress.IPv4Network((mapped.ipv4_mapped, network.prefixlen - 96))
    return network


def _name(entry: str) -> str:
    """A host name entry as http/urls/targets.py writes a URL's host: IDNA's form, lower case, no
    final dot (an entry IDNA refuses stays as written, and matches nothing)."""
    name = entry
    if not name.isascii():
        try:
            name = idna.encode(name, uts46=True).decode("ascii")
        except UnicodeError:
            return entry
    name = name.lower()
    return name[:-1] if name.endswith(".") else name


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
