"""`HttpSender`: one POST of one message to one subscriber. Returns an AttemptResult and never
raises: every failure (status, timeout, connection error) is data for the retry policy."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from msgbus.delivery.headers import push_headers
from msgbus.models import AttemptResult, Envelope, Subscription, utcnow


def _retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None  # an HTTP date: rare for webhooks; the policy's own delay applies


class HttpSender:
    def __init__(self, *, instance: str, max_connections: int = 1000) -> None:
        self.instance = instance
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=self._max_connections, limit_per_host=0,
                                         ttl_dns_cache=60)
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def push(self, envelope: Envelope, subscription: Subscription,
                   attempt: int) -> AttemptResult:
        assert self._session is not None, "HttpSender.start() was not called"
        started_at = utcnow()
        t0 = time.perf_counter()
        status: int | None = None
        error: str | None = None
        retry_after: float | None = None
        try:
            timeout = aiohttp.ClientTimeout(total=subscription.timeout_ms / 1000)
            async with self._session.post(
                str(subscription.url), data=envelope.body,
                headers=push_headers(envelope, subscription, attempt), timeout=timeout,
            ) as response:
                await response.read()
                status = response.status
                if not 200 <= status < 300:
                    error = f"HTTP {status}"
                    retry_after = _retry_after(response.headers.get("retry-after"))
        except TimeoutError:
            error = f"timeout after {subscription.timeout_ms} ms"
        except (aiohttp.ClientError, OSError) as exc:
            error = f"{type(exc).__name__}: {exc}"[:500]
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # an unexpected bug must still become a failed attempt
            error = f"unexpected {type(exc).__name__}: {exc}"[:500]
        return AttemptResult(
            message_id=envelope.message_id, subscription=subscription.id, attempt=attempt,
            started_at=started_at, latency_ms=(time.perf_counter() - t0) * 1000,
            status_code=status, error=error, instance=self.instance, retry_after_s=retry_after,
        )
