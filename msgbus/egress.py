"""`EgressPolicy`: which addresses the bus may push to. Subscription URLs are typed by people, and
the bus runs inside the company's network: without a policy it is a proxy into that network
(server-side request forgery). By default an address that is loopback, link-local (the cloud
metadata address 169.254.169.254 included), private, unique-local, shared (CGNAT), multicast,
unspecified or reserved is refused; `allowed` networks (CIDRs) open some of them again and
`denied` networks close more, a denial winning over an allowance.

The push clients check the address they are about to connect to, after resolving the host
(`addresses`), and connect to that very address: a name that resolved to a public address when
the URL was written and to an internal one at push time (DNS rebinding) is refused then, with
no connection made. The admin checks a URL when it is written (`url_refusal`), for a clear 422.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

SHARED_ADDRESS_SPACE = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT (RFC 6598)
LOOPBACK_ONLY = "127.0.0.0/8,::1/128"  # what `msgbus up` allows, for its demo subscriber


class EgressRefused(OSError):
    """A push (or a URL) the egress policy refuses. An OSError, so that every push client
    records it as a failed attempt, like a refused connection."""


def _kind_refused_by_default(address: IPAddress) -> str | None:
    """Why `address` is internal, or None for a public one."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return _kind_refused_by_default(address.ipv4_mapped)
    if address.is_unspecified:
        return "unspecified"
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local (cloud metadata among them)"
    if address.is_multicast:
        return "multicast"
    if address in SHARED_ADDRESS_SPACE:
        return "shared (carrier-grade NAT)"
    if isinstance(address, ipaddress.IPv6Address) and address in _UNIQUE_LOCAL:
        return "unique-local"
    if address.is_reserved:
        return "reserved"
    if address.is_private:
        return "private"
    return None


_UNIQUE_LOCAL = ipaddress.ip_network("fc00::/7")


def parse_networks(text: str, setting: str) -> tuple[IPNetwork, ...]:
    """Comma-separated CIDRs (a bare address is one host); ValueError naming `setting`."""
    networks = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError as exc:
            raise ValueError(f"{setting}: {item!r} is not a network (CIDR): {exc}") from None
    return tuple(networks)


Resolver = Callable[[str, int], Awaitable[list[str]]]  # (host, port) -> its addresses


async def system_resolver(host: str, port: int) -> list[str]:
    """The host's addresses from the system's resolver (getaddrinfo), without repeats."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


@dataclass(frozen=True)
class EgressPolicy:
    allowed: tuple[IPNetwork, ...] = ()
    denied: tuple[IPNetwork, ...] = ()
    resolver: Resolver = field(default=system_resolver, compare=False, repr=False)

    @classmethod
    def parse(cls, allowed: str = "", denied: str = "") -> EgressPolicy:
        return cls(parse_networks(allowed, "allowed networks"),
                   parse_networks(denied, "denied networks"))

    def refusal(self, address: IPAddress) -> str | None:
        """Why the policy refuses `address`, or None when a push may go there."""
        mapped = (address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address)
                  else None) or address
        if any(mapped in network for network in self.denied if network.version == mapped.version):
            return "in a denied network"
        if any(mapped in network for network in self.allowed
               if network.version == mapped.version):
            return None
        kind = _kind_refused_by_default(mapped)
        return f"a {kind} address" if kind else None

    async def addresses(self, host: str, port: int) -> list[str]:
        """The addresses of `host` a push may connect to, in the resolver's order; raises
        EgressRefused when there are none (naming the first refused one and why)."""
        literal = _ip_literal(host)
        found = ([literal] if literal is not None
                 else [ipaddress.ip_address(a) for a in await self.resolver(host, port)])
        if not found:
            raise OSError(f"{host} resolves to no address")
        allowed = [str(address) for address in found if self.refusal(address) is None]
        if not allowed:
            raise self._refused(host, found[0])
        return allowed

    def check_url_literal(self, url: str) -> None:
        """Raises EgressRefused when `url`'s host is an IP address the policy refuses. For a
        client that resolves names through the policy but connects to IP literals directly
        (aiohttp does)."""
        host = urlsplit(url).hostname
        literal = _ip_literal(host) if host else None
        if literal is not None and self.refusal(literal) is not None:
            raise self._refused(host or "", literal)

    def _refused(self, host: str, address: IPAddress) -> EgressRefused:
        return EgressRefused(f"egress policy: {host} is {address}, {self.refusal(address)}; "
                             "refused (MSGBUS_PUSH_ALLOW_NETWORKS opens a network)")

    async def url_refusal(self, url: str) -> str | None:
        """Why pushes to `url` would be refused now (its host is, or resolves to, only refused
        addresses); None when allowed or when the name does not resolve yet (every push checks
        again)."""
        parts = urlsplit(url)
        if not parts.hostname:
            return None
        try:
            await self.addresses(parts.hostname, parts.port or _default_port(parts.scheme))
        except EgressRefused as exc:
            return str(exc)
        except OSError:  # not resolvable now: the push checks what it resolves to then
            return None
        return None


def _ip_literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def _default_port(scheme: str) -> int:
    return 443 if scheme == "https" else 80
