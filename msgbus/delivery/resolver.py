"""`PolicyResolver`: aiohttp's resolver that returns only the addresses the egress policy allows
(msgbus/egress.py); aiohttp connects to what it returns, so no second lookup can differ. The
company's proxy is the operator's choice, and resolved as it is.

aiohttp asks its resolver for names only, and for the proxy only when one is used:
`checked_before_proxy` checks what it does not see (an IP address in the URL, and the host a
proxy will connect to)."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from aiohttp.abc import AbstractResolver, ResolveResult

from msgbus.delivery.proxy import PushProxy
from msgbus.egress import EgressPolicy, system_resolver


class PolicyResolver(AbstractResolver):
    def __init__(self, egress: EgressPolicy, proxy: PushProxy | None = None) -> None:
        self._egress = egress
        self._proxy_host = proxy.host if proxy is not None else None

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        if host == self._proxy_host:
            addresses = await system_resolver(host, port)
        else:
            addresses = await self._egress.addresses(host, port)
        return [{"hostname": host, "host": address, "port": port,
                 "family": socket.AF_INET6 if ":" in address else socket.AF_INET,
                 "proto": 0, "flags": socket.AI_NUMERICHOST} for address in addresses]

    async def close(self) -> None:
        pass


async def checked_before_proxy(egress: EgressPolicy, url: str, proxy: str | None) -> None:
    """Raises EgressRefused for what aiohttp's resolver would not see: an IP address in `url`
    the policy refuses, or, through `proxy`, a host that resolves only to refused ones."""
    if proxy is None:
        egress.check_url_literal(url)
        return
    parts = urlsplit(url)
    await egress.addresses(parts.hostname or "", parts.port or (443 if parts.scheme == "https"
                                                                 else 80))
