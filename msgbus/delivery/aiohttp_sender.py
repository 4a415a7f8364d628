"""`AiohttpSender`: the `Sender` on aiohttp's connection pool, the fallback to `H1Sender` for a
subscriber that needs what the lean client does not do (e.g. a proxy set in code)."""

from __future__ import annotations

import socket

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from msgbus.delivery.sender import USER_AGENT, BaseSender
from msgbus.egress import EgressPolicy, EgressRefused
from msgbus.sealing import SecretKeys


class AiohttpSender(BaseSender):
    """aiohttp's connection pool: `max_connections` in all, no per-host limit, no
    decompression of answers (they are read and dropped, but for the first bytes of a failed
    push's answer)."""

    transport_errors = (aiohttp.ClientError, OSError)

    def __init__(self, *, instance: str, max_connections: int = 1000,
                 answer_keep_bytes: int = 1024, egress: EgressPolicy | None = None,
                 keys: SecretKeys | None = None) -> None:
        super().__init__(instance=instance, max_connections=max_connections,
                         answer_keep_bytes=answer_keep_bytes, egress=egress, keys=keys)
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        # Idle connections are closed after 4 s, before common servers close theirs (uvicorn
        # 5 s): a POST on a connection the server is closing at that moment fails without
        # reaching it, and would wait for a retry.
        connector = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=0,
                                         ttl_dns_cache=60, keepalive_timeout=4.0,
                                         resolver=_PolicyResolver(self.egress))
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                              headers={"user-agent": USER_AGENT})

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _post(self, url: str, body: bytes, headers: dict[str, str],
                    timeout_s: float) -> tuple[int, str | None, bytes | None]:
        assert self._session is not None, "AiohttpSender.start() was not called"
        try:
            return await self._post_on(self._session, url, body, headers, timeout_s)
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, EgressRefused):  # its own words, not "[None]"
                raise exc.os_error from None
            raise

    async def _post_on(self, session: aiohttp.ClientSession, url: str, body: bytes,
                       headers: dict[str, str], timeout_s: float
                       ) -> tuple[int, str | None, bytes | None]:
        async with session.post(url, data=body, headers=headers, allow_redirects=False,
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
            kept = None
            if 200 <= response.status < 300 or not self.answer_keep_bytes:
                await response.read()
            else:
                kept = await _first_bytes(response.content, self.answer_keep_bytes)
            return response.status, response.headers.get("retry-after"), kept


class _PolicyResolver(AbstractResolver):
    """aiohttp connects to the addresses this returns: only those the egress policy allows."""

    def __init__(self, egress: EgressPolicy) -> None:
        self._egress = egress

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        addresses = await self._egress.addresses(host, port)
        return [{"hostname": host, "host": address, "port": port,
                 "family": socket.AF_INET6 if ":" in address else socket.AF_INET,
                 "proto": 0, "flags": socket.AI_NUMERICHOST} for address in addresses]

    async def close(self) -> None:
        pass


async def _first_bytes(content: aiohttp.StreamReader, limit: int) -> bytes:
    """Up to `limit` bytes of a body, and no more read: a longer body is left unread, and
    aiohttp closes its connection instead of reusing it."""
    kept = b""
    while len(kept) < limit:
        chunk = await content.read(limit - len(kept))
        if not chunk:
            break
        kept += chunk
    return kept
