"""`PushProxy`: pushes (and OAuth2 token fetches, and teams' notifications) leave through the
company's HTTP proxy (`MSGBUS_PUSH_PROXY`), but for the hosts of `MSGBUS_PUSH_NO_PROXY`.

The no-proxy list is read as curl and most tools read NO_PROXY: comma-separated entries, each a
host name (matching itself and its subdomains; a leading dot is the same), an IP address, a
CIDR, or `*` (no proxy at all). The proxy's own address is the operator's choice and is not
under the egress policy; every pushed-to host still is: its name is resolved and checked before
the request goes to the proxy (the proxy resolves it again; a proxy that enforces its own
policy closes that gap).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from msgbus.egress import IPNetwork


@dataclass(frozen=True)
class PushProxy:
    url: str
    host: str
    names: tuple[str, ...] = ()  # lowercase, without a leading dot
    networks: tuple[IPNetwork, ...] = ()
    everything_direct: bool = False

    @classmethod
    def parse(cls, proxy: str, no_proxy: str = "") -> PushProxy | None:
        """None when `proxy` is empty; a ValueError naming the setting when it is wrong."""
        if not proxy.strip():
            return None
        parts = urlsplit(proxy.strip())
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError("MSGBUS_PUSH_PROXY is an http:// URL (http://[user:password@]"
                             "host:port); pushes to https URLs are tunnelled through it")
        names: list[str] = []
        networks: list[IPNetwork] = []
        for entry in (e.strip().lower() for e in no_proxy.split(",")):
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
            except ValueError:
                names.append(entry.lstrip("."))
        return cls(proxy.strip(), parts.hostname, tuple(names), tuple(networks),
                   everything_direct="*" in names)

    def for_url(self, url: str) -> str | None:
        """The proxy to push to `url` through; None to connect directly."""
        host = (urlsplit(url).hostname or "").lower()
        if self.everything_direct or self._bypassed(host):
            return None
        return self.url

    def _bypassed(self, host: str) -> bool:
        try:
            address = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            return any(host == name or host.endswith("." + name) for name in self.names)
        return any(address.version == network.version and address in network
                   for network in self.networks)
