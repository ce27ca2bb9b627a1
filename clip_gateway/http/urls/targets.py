"""A URL item's string parsed into exactly what will be fetched, or refused saying why: the one
parse-and-normalise step every URL goes through, the client's and each redirect's ``Location``
alike, before the guard (http/urls/guard.py) sees its host and before http/urls/fetch.py connects.

Nothing is guessed, and nothing that parsers read differently is passed on. The normalisations
are the standard ones, each exact: a non-ASCII host is its IDNA form (UTS 46, as browsers look
it up; refused when IDNA refuses it), a host that ends in a number is the IPv4 address the C
library reads in it (every spelling ``inet_aton`` takes) or refused, a name is lower-cased
without its final dot, and in the path and query every character outside RFC 3986's is
percent-encoded (a space, a non-ASCII character as its UTF-8 bytes, a stray ``%`` as ``%25``);
the fragment is never sent. Refused (``UrlRefused``, naming the rule): control characters, a
backslash (WHATWG reads it as ``/``, RFC 3986 does not), userinfo, brackets around anything but
an IPv6 address, a zone id, percent-encoding in the host, an empty label, a label over 63 or a
host over 253 characters, a port outside 1-65535, a URL over ``MAX_URL_CHARS``.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import NoReturn
from urllib.parse import quote, urljoin

import idna

from clip_gateway.errors import UrlRefused
from clip_gateway.http.urls import guard

#: The longest URL fetched, as sent (servers commonly refuse request lines over 8 KiB).
MAX_URL_CHARS = 8192
#: DNS's limits on a name and on each of its labels.
MAX_HOST_CHARS, MAX_LABEL_CHARS = 253, 63
_DEFAULT_PORTS = {"http": 80, "https": 443}
#: RFC 3986 appendix B: scheme, authority (present when ``//`` is), path, query, fragment.
_SPLIT = re.compile(r"(?:([^:/?#]*):)?(//([^/?#]*))?([^?#]*)(?:\?([^#]*))?(?:#.*)?", re.DOTALL)
#: C0, DEL and C1 controls: never in a URL, and some parsers drop them silently.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_LABEL = re.compile(r"[a-z0-9_-]+")
#: WHATWG's "ends in a number": such a host is an IPv4 address or nothing.
_NUMBER = re.compile(r"[0-9]+|0x[0-9a-f]*")
#: What stays as it is in a path (RFC 3986 pchar and ``/``) and a query (also ``?``); a ``%``
#: only as the start of an escape.
_PATH_SAFE = r"A-Za-z0-9\-._~!$&'()*+,;=:@/"
_UNSAFE_PATH = re.compile(rf"%(?![0-9A-Fa-f]{{2}})|[^{_PATH_SAFE}%]")
_UNSAFE_QUERY = re.compile(rf"%(?![0-9A-Fa-f]{{2}})|[^{_PATH_SAFE}?%]")


@dataclass(frozen=True)
class Target:
    """What one fetch asks for: ``host`` is an ASCII name (lower case, IDNA's form) or an
    address as ``ipaddress`` writes it (``address``), ``target`` the path and query as sent."""

    scheme: str
    host: str
    port: int
    target: str
    address: guard.Address | None = None

    @property
    def authority(self) -> str:
        """The ``Host`` header: the host (an IPv6 address in brackets), and a port not the
        scheme's own."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == _DEFAULT_PORTS[self.scheme] else f"{host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.authority}{self.target}"


def parse(text: str) -> Target:
    """``text`` as what will be fetched, or UrlRefused naming the rule it breaks."""
    if len(text) > MAX_URL_CHARS:
        _refuse("syntax", f"the URL is {len(text)} characters; at most {MAX_URL_CHARS} are fetched")
    control = _CONTROL.search(text)
    if control is not None:
        _refuse("syntax", f"the URL holds a control character (U+{ord(control.group()):04X} at "
                f"character {control.start()})")  # fmt: skip
    try:
        text.encode("utf-8", "surrogateescape")  # a byte a Location carried is one of these
    except UnicodeEncodeError as exc:
        _refuse("syntax", f"the URL holds U+{ord(text[exc.start]):04X}, not a Unicode character")
    if "\\" in text:
        _refuse("syntax", "the URL holds a backslash, which URL parsers read differently "
                "(WHATWG as '/'); percent-encode it as %5C")  # fmt: skip
    split = _SPLIT.fullmatch(text)
    assert split is not None  # every string matches: each group may be empty
    scheme = (split.group(1) or "").lower()
    if scheme not in _DEFAULT_PORTS:
        _refuse("scheme", f"URL scheme {scheme[:16]!r} is not fetched; only http and https")
    authority = split.group(3)
    if not authority:
        _refuse("host", "the URL has no host (http://host/...)")
    if "@" in authority:
        _refuse("userinfo", "URLs with credentials (user@ or user:password@) are not fetched")
    host_text, port_text = _split_authority(authority)
    host, address = _host(host_text)
    port = _port(port_text, scheme)
    path = _UNSAFE_PATH.sub(_escape, split.group(4)) or "/"  # after an authority: "" or /...
    query = split.group(5)
    target = path if query is None else f"{path}?{_UNSAFE_QUERY.sub(_escape, query)}"
    parsed = Target(scheme, host, port, target, address)
    if len(parsed.url) > MAX_URL_CHARS:
        _refuse("syntax", f"the URL is {len(parsed.url)} characters once percent-encoded; at "
                f"most {MAX_URL_CHARS} are fetched")  # fmt: skip
    return parsed


def follow(current: Target, location: bytes) -> Target:
    """Where a redirect's ``Location`` (a URL reference, resolved against ``current``, RFC 3986
    section 5) leads, through the same step as the client's URL; refused saying it was the
    redirect. Bytes that are not UTF-8 stay the bytes they were, percent-encoded."""
    text = location.decode("utf-8", "surrogateescape")
    try:
        if not text.strip():
            _refuse("syntax", "it is empty")
        control = _CONTROL.search(text)
        if control is not None:  # urljoin would drop some of them silently
            _refuse("syntax", f"it holds a control character (U+{ord(control.group()):04X})")
        try:
            joined = urljoin(current.url, text)
        except ValueError as exc:  # unbalanced brackets, an authority NFKC would change
            _refuse("syntax", f"it cannot be read as a URL ({exc})")
        return parse(joined)
    except UrlRefused as exc:
        exc.reason = f"the server redirected to a URL that is not fetched: {exc.reason}"
        exc.args = (exc.reason,)
        raise


def _split_authority(authority: str) -> tuple[str, str | None]:
    """The host and the port text (None: none given) of an authority without userinfo."""
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            _refuse("host", "the URL's host opens a '[' it does not close")
        rest = authority[end + 1 :]
        if rest and not rest.startswith(":"):
            _refuse("host", "the URL's host goes on after its ']'")
        return authority[: end + 1], rest[1:] if rest else None
    if "[" in authority or "]" in authority:
        _refuse("host", "the URL's host holds a '[' or ']' that does not enclose an IPv6 address")
    host, colon, port = authority.partition(":")
    if ":" in port:
        _refuse("host", "an IPv6 address in a URL goes in brackets: http://[2001:db8::1]/")
    return host, port if colon else None


def _host(text: str) -> tuple[str, guard.Address | None]:
    """The host as it will be looked up and sent, and the address it is, if it is one."""
    if text.startswith("["):
        return _bracketed(text[1:-1])
    if "%" in text:
        _refuse("host", "percent-encoding in a URL's host is not fetched; send the host itself")
    name = text
    if not name.isascii():
        try:
            name = idna.encode(name, uts46=True).decode("ascii")
        except UnicodeError as exc:  # idna.IDNAError is one
            _refuse("host", f"the URL's host is not a valid internationalised name: {exc}")
    name = name.lower()
    name = name[:-1] if name.endswith(".") else name
    labels = _labels(name)
    if _NUMBER.fullmatch(labels[-1]):
        address = guard.ipv4(name)
        if address is None:
            _refuse("host", "the URL's host ends in a number but is not an IPv4 address")
        return str(address), address
    return name, None


def _bracketed(inner: str) -> tuple[str, guard.Address]:
    """The IPv6 address between a host's brackets (nothing else may be there)."""
    if "%" in inner:
        _refuse("host", "a URL host with an IPv6 zone id is not fetched (it names an "
                "interface of this machine)")  # fmt: skip
    try:
        address = ipaddress.IPv6Address(inner)
    except ValueError:
        _refuse("host", f"[{inner[:64]}] in the URL's host is not an IPv6 address")
    return str(address), address


def _labels(name: str) -> list[str]:
    """The labels of a host name, each within DNS's limits and of the characters names use."""
    if not name:
        _refuse("host", "the URL has no host (http://host/...)")
    if len(name) > MAX_HOST_CHARS:
        _refuse("host", f"the URL's host is {len(name)} characters; a name has at most "
                f"{MAX_HOST_CHARS}")  # fmt: skip
    labels = name.split(".")
    for label in labels:
        if not label:
            _refuse("host", "the URL's host has an empty label (a leading dot or two in a row)")
        if len(label) > MAX_LABEL_CHARS:
            _refuse("host", f"the URL's host has a label of {len(label)} characters; a label "
                    f"has at most {MAX_LABEL_CHARS}")  # fmt: skip
        bad = _LABEL.sub("", label)
        if bad:
            _refuse("host", f"the URL's host holds {bad[0]!r}; a name is letters, digits, "
                    "'-' and '_'")  # fmt: skip
    return labels


def _port(text: str | None, scheme: str) -> int:
    if not text:  # none, or an empty one (http://host:/): the scheme's own
        return _DEFAULT_PORTS[scheme]
    if not (len(text) <= 5 and text.isascii() and text.isdigit()) or not 0 < int(text) < 65536:
        _refuse("port", f"the URL's port {text[:16]!r} is not a number from 1 to 65535")
    return int(text)


def _escape(match: re.Match[str]) -> str:
    return quote(match.group(), safe="", errors="surrogateescape")


def _refuse(rule: str, reason: str) -> NoReturn:
    raise UrlRefused(f"{reason} (rule: {rule})", rule=rule)
