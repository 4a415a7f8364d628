"""`AiohttpSender`: the `Sender` on aiohttp's connection pool, the fallback to `H1Sender`, and the
client of pushes through the company's proxy (MSGBUS_PUSH_PROXY), which the lean client does not
speak."""

from __future__ import annotations

import ssl

import aiohttp

from msgbus.delivery.proxy import PushProxy
from msgbus.delivery.resolver import PolicyResolver, checked_before_proxy
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
                 keys: SecretKeys | None = None, proxy: PushProxy | None = None) -> None:
        super().__init__(instance=instance, max_connections=max_connections,
                         answer_keep_bytes=answer_keep_bytes, egress=egress, keys=keys,
                         proxy=proxy)
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        # Idle connections are closed after 4 s, before common servers close theirs (uvicorn
        # 5 s): a POST on a connection the server is closing at that moment fails without
        # reaching it, and would wait for a retry.
        connector = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=0,
                                         ttl_dns_cache=60, keepalive_timeout=4.0,
                                         resolver=PolicyResolver(self.egress, self.proxy))
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                              headers={"user-agent": USER_AGENT})

    async def close(self) -> None:
        await super().close()
        if self._session is not None:
            await self._session.close()

    async def _post(self, url: str, body: bytes, headers: dict[str, str],
                    timeout_s: float, tls: ssl.SSLContext | None = None
                    ) -> tuple[int, str | None, bytes | None]:
        assert self._session is not None, "AiohttpSender.start() was not called"
        proxy = self.proxy.for_url(url) if self.proxy is not None else None
        try:
            await checked_before_proxy(self.egress, url, proxy)
            return await self._post_on(self._session, url, body, headers, timeout_s, tls,
                                       proxy)
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, EgressRefused):  # its own words, not "[None]"
                raise exc.os_error from None
            raise

    async def _post_on(self, session: aiohttp.ClientSession, url: str, body: bytes,
                       headers: dict[str, str], timeout_s: float,
                       tls: ssl.SSLContext | None = None, proxy: str | None = None
                       ) -> tuple[int, str | None, bytes | None]:
        # aiohttp pools connections by TLS context too: a client certificate is not shared
        async with session.post(url, data=body, headers=headers, allow_redirects=False,
                                ssl=tls if tls is not None else True, proxy=proxy,
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
            kept = None
            if 200 <= response.status < 300 or not self.answer_keep_bytes:
                await response.read()
            else:
                kept = await _first_bytes(response.content, self.answer_keep_bytes)
            return response.status, response.headers.get("retry-after"), kept


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
