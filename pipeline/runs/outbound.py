"""Where nightshift may POST a URL that a caller chose (a run's or a batch's notify_url).

Whoever can start a run chooses its notify_url, and a worker POSTs to it: unchecked, a token
holder could aim the workers at the API itself, the broker, or anything else on their network.
So a URL's host is resolved and every address it resolves to must be allowed by
NIGHTSHIFT_NOTIFY_ALLOWED: `public` (the default: no private, loopback, link-local or reserved
address), networks (`10.1.2.0/24`, `127.0.0.1`) and host names (`hooks.internal`), separated by
commas. Numeric spellings (`2130706433`, `0x7f.1`, `[::1]`, `::ffff:127.0.0.1`) resolve to the
address they mean and are checked as it, and so are the IPv6 forms that carry an IPv4 address
(NAT64 `64:ff9b::a9fe:a9fe` is 169.254.169.254, 6to4 `2002:7f00:1::` is 127.0.0.1). A sender
connects to the address it checked, never to a second lookup (DNS rebinding), sends no URL
userinfo, and follows no redirects.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

from pipeline.errors import InvalidInput, TargetRefused, TargetUnresolved, redact_url

PUBLIC = "public"
SETTING = "NIGHTSHIFT_NOTIFY_ALLOWED"
ANYWHERE = frozenset({"0.0.0.0/0", "::/0"})
"""Every address: for a URL the operator configured (NIGHTSHIFT_ALERT_WEBHOOK_URL), which the
policy for callers' URLs does not cover; it is still resolved once and pinned."""
_DEFAULT_PORTS = {"http": 80, "https": 443}

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class Target:
    """A URL as checked: connect to `address`, name `host` (the Host header, TLS SNI)."""

    url: str
    host: str
    address: str
    port: int

    @property
    def pinned_url(self) -> str:
        """The URL with its host replaced by the checked address (the request goes there)."""
        parts = urlsplit(self.url)
        shown = f"[{self.address}]" if ":" in self.address else self.address
        return parts._replace(netloc=f"{shown}:{self.port}").geturl()

    @property
    def host_header(self) -> str:
        return urlsplit(self.url).netloc

    @property
    def receiver(self) -> str:
        return receiver_of(self.url)


def receiver_of(url: str) -> str:
    """Who answers a URL (`scheme://host:port` as written): a receiver's failures put off its
    other deliveries, never another's, and a worker sends it one delivery at a time."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


def check_form(url: str, what: str) -> SplitResult:
    """The URL's parts, if it is one nightshift could send to at all. Raises InvalidInput."""
    parts = urlsplit(url)
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
        raise InvalidInput(f"{what} must be an http:// or https:// URL with a host")
    if parts.username is not None or parts.password is not None:
        raise TargetRefused(
            f"{what} must not carry a user name or password (user:pass@): they would be sent "
            "to the receiver; it can check the events' signature instead"
        )
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number in range
    except ValueError:
        raise InvalidInput(f"{what} has a port that is not a number from 1 to 65535") from None
    return parts


def resolve_target(url: str, allowed: frozenset[str], what: str = "notify_url") -> Target:
    """The URL, resolved once and checked against `allowed`. Raises TargetRefused, or
    TargetUnresolved when its host does not resolve now."""
    parts = check_form(url, what)
    host = str(parts.hostname)
    port = parts.port or _DEFAULT_PORTS[parts.scheme]
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise TargetUnresolved(f"{what} host {host!r} does not resolve ({exc})") from None
    addresses = [str(info[4][0]) for info in found]
    for address in addresses:
        if not permitted(host, ipaddress.ip_address(address), allowed):
            raise TargetRefused(
                f"{what} {redact_url(url)} resolves to {address}, which {SETTING} does not "
                f"allow (it allows: {', '.join(sorted(allowed)) or 'nothing'}); nightshift "
                "sends to private, loopback and link-local addresses only when listed there"
            )
    return Target(url=url, host=host, address=addresses[0], port=port)


def permitted(host: str, address: Address, allowed: frozenset[str]) -> bool:
    if host.lower() in allowed:
        return True
    address = meant(address)
    for entry in allowed - {PUBLIC}:
        network = _network(entry)
        if network is not None and network.version == address.version and address in network:
            return True
    return PUBLIC in allowed and _public(address)


# IPv6 forms that carry an IPv4 address in their last 32 bits: IPv4-mapped (::ffff:a.b.c.d),
# IPv4-translated (::ffff:0:a.b.c.d), IPv4-compatible (::a.b.c.d, deprecated) and the NAT64
# well-known prefix (64:ff9b::a.b.c.d), which a NAT64 gateway forwards to that IPv4 address.
_CARRIES_IPV4 = tuple(
    ipaddress.IPv6Network(network)
    for network in ("::ffff:0:0/96", "::ffff:0:0:0/96", "::/96", "64:ff9b::/96")
)
_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")


def meant(address: Address) -> Address:
    """The address a packet to `address` ends up at: an IPv6 form that carries an IPv4
    address (above, and 6to4's 2002:a.b.c.d::/48) means that IPv4 address."""
    if isinstance(address, ipaddress.IPv4Address):
        return address
    if address.sixtofour is not None:
        return address.sixtofour
    if any(address in network for network in _CARRIES_IPV4):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def _public(address: Address) -> bool:
    """A public unicast address. IPv6 must also be global unicast (2000::/3): Python 3.11's
    is_global takes site-local fec0::/10 and the local-use NAT64 prefix 64:ff9b:1::/48 for
    global, and Teredo (2001::/32) is not global either."""
    if address.is_multicast or not address.is_global:
        return False
    return isinstance(address, ipaddress.IPv4Address) or address in _GLOBAL_UNICAST


def _network(entry: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    try:
        return ipaddress.ip_network(entry, strict=False)
    except ValueError:
        return None  # a host name
