"""`HttpxSender`: the `Sender` on httpx's connection pool (HTTP/1.1), the alternative to the
default `AiohttpSender`; see `msgbus/delivery/sender.py` for why aiohttp is the default and the
figures behind it (`python -m bench.senders`)."""

from __future__ import annotations

import asyncio

import httpx

from msgbus.delivery.sender import BaseSender


class HttpxSender(BaseSender):
    """httpx's pool: `max_connections` in all, every one kept alive (httpx keeps only 20 by
    default, which closes and reopens connections under load), no proxy from the environment
    (as aiohttp), and answers drained raw, without decompression.

    The total timeout is `asyncio.timeout` around the whole request, as aiohttp's `total`; httpx's
    own per-phase (connect, write, read, pool) timeouts get the same value."""

    timeout_errors = (TimeoutError, httpx.TimeoutException)
    transport_errors = (httpx.HTTPError, OSError)

    def __init__(self, *, instance: str, max_connections: int = 1000) -> None:
        super().__init__(instance=instance, max_connections=max_connections)
        self._client: httpx.AsyncClient | None = None

    async def start(self) -> None:
        limits = httpx.Limits(max_connections=self.max_connections,
                              max_keepalive_connections=self.max_connections)
        self._client = httpx.AsyncClient(limits=limits, timeout=None, trust_env=False,
                                         follow_redirects=False)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    async def _post(self, url: str, body: bytes, headers: dict[str, str],
                    timeout_s: float) -> tuple[int, str | None]:
        assert self._client is not None, "HttpxSender.start() was not called"
        async with (
            asyncio.timeout(timeout_s),
            self._client.stream("POST", url, content=body, headers=headers,
                                timeout=httpx.Timeout(timeout_s)) as response,
        ):
            async for _ in response.aiter_raw():
                pass
            return response.status_code, response.headers.get("retry-after")
