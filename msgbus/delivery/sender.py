"""Senders: one POST of one message to one subscriber. `push()` returns an AttemptResult and never
raises: every failure (status, timeout, connection error) is data for the retry policy.

- `Sender`: the interface the dispatcher depends on (`start`, `close`, `push`, `instance`).
- `BaseSender`: what every implementation shares — the timing, the total timeout
  (`subscription.timeout_ms`), the mapping of failures to error text, Retry-After parsing and the
  AttemptResult. An implementation only supplies `_post()` and its exception types.
- `AiohttpSender` (here, the default) and `HttpxSender`
  (`msgbus/delivery/httpx_sender.py`); `make_sender(kind, instance=...)` picks one, from
  `DispatcherSettings.http_client` (`MSGBUS_DISPATCHER_HTTP_CLIENT`).

Decision (issue 5): **aiohttp is the default**; httpx stays available behind the same interface
but is not fit for the dispatcher's load. `python -m bench.senders --runs 3` (each phase in a
fresh process beside one recording subscriber on 127.0.0.1; 5 s measured after 1 s warm-up;
asyncio's own loop as `msgbus dispatcher`; aiohttp 3.14.5, httpx 0.28.1 / httpcore 1.0.9,
anyio 4.16, sniffio 1.3.1; 2 cores, shared with another benchmark running at the same time, so
pushes/s is noisy and pushes per CPU-second of the sender process is the figure to compare).
min / median / max over 3 runs:

    64 in flight   pushes/s            p50 ms             p99 ms               pushes/cpu-s
    raw aiohttp    2106 / 3148 / 3213  18.7 / 19.0 / 28.5  34.5 / 41.0 / 83.8   4710 / 5052 / 5328
    AiohttpSender  2215 / 2841 / 3393  18.9 / 18.9 / 28.1  33.0 / 47.4 / 50.2   3202 / 3533 / 3747
    HttpxSender      63 /  118 /  125   309 /  335 /  761  2668 / 2688 / 3373    107 /  136 /  137

    16 in flight   pushes/s            p50 ms             p99 ms               pushes/cpu-s
    raw aiohttp     878 / 2128 / 3178   4.4 /  6.5 / 13.7  13.0 / 21.6 / 83.8   3542 / 4068 / 5060
    AiohttpSender  1479 / 2248 / 2374   5.6 /  6.1 /  8.3  19.0 / 20.9 / 53.6   2891 / 3678 / 3761
    HttpxSender     205 /  276 /  357  28.2 / 29.1 / 37.7   187 /  320 /  625    311 /  370 /  440

Medians, paired with the raw loop of the same run: AiohttpSender 1.06x raw at 64 and at 16 in
flight (within the noise; per push it costs ~10-45% more CPU than raw: the signed headers, the
timeout, the AttemptResult); HttpxSender 0.037x at 64 and 0.11x at 16, and one of its pushes
timed out (5 s) at 64. httpx's cost grows with the pushes in flight (pushes per CPU-second: ~140
at 64, ~370 at 16, ~700 at 4 in a single 1 s run): httpcore's pool re-scans every connection for
every queued request (`_assign_requests_to_connections`, `is_idle`, a socket-readability check
per idle connection through anyio), so its CPU goes to bookkeeping, not to HTTP. The issue's
httpx figure (0.7-1.3k pushes/s per core) is in line with the low-concurrency end; its aiohttp
figure (~12k) was not reproduced here (3.5-5k pushes per CPU-second with asyncio's loop on this
loaded machine), but the ratio, an order of magnitude or more, and so the verdict, hold.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from typing import Protocol

import aiohttp

from msgbus.delivery.headers import push_headers
from msgbus.models import AttemptResult, Envelope, Subscription, utcnow

ERROR_TEXT_MAX = 500
SENDER_KINDS = ("aiohttp", "httpx")


class Sender(Protocol):
    """Pushes one message to one subscriber; `push()` never raises (failures are data)."""

    instance: str

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def push(self, envelope: Envelope, subscription: Subscription,
                   attempt: int) -> AttemptResult: ...


def retry_after_s(value: str | None) -> float | None:
    """A Retry-After header in seconds; None when absent or an HTTP date (rare for webhooks: the
    policy's own delay applies)."""
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def timeout_text(subscription: Subscription) -> str:
    return f"timeout after {subscription.timeout_ms} ms"


def error_text(exc: BaseException, *, unexpected: bool = False) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return (f"unexpected {text}" if unexpected else text)[:ERROR_TEXT_MAX]


class BaseSender(ABC):
    """The shared `push()`: implementations supply `_post()`, `start()`, `close()` and which of
    their exceptions are timeouts and which are transport (connection, protocol) errors."""

    timeout_errors: tuple[type[BaseException], ...] = (TimeoutError,)
    transport_errors: tuple[type[BaseException], ...] = (OSError,)

    def __init__(self, *, instance: str, max_connections: int = 1000) -> None:
        self.instance = instance
        self.max_connections = max_connections

    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    async def close(self) -> None: ...

    @abstractmethod
    async def _post(self, url: str, body: bytes, headers: dict[str, str],
                    timeout_s: float) -> tuple[int, str | None]:
        """POST within `timeout_s` in total, read the whole answer; return its status and its
        Retry-After header (or None). Raises on a timeout or a transport error."""

    async def push(self, envelope: Envelope, subscription: Subscription,
                   attempt: int) -> AttemptResult:
        started_at = utcnow()
        t0 = time.perf_counter()
        status: int | None = None
        error: str | None = None
        retry_after: float | None = None
        try:
            status, retry_after_header = await self._post(
                str(subscription.url), envelope.body,
                push_headers(envelope, subscription, attempt), subscription.timeout_ms / 1000)
            if not 200 <= status < 300:
                error = f"HTTP {status}"
                retry_after = retry_after_s(retry_after_header)
        except asyncio.CancelledError:
            raise
        except self.timeout_errors:  # before transport_errors: TimeoutError is an OSError
            error = timeout_text(subscription)
        except self.transport_errors as exc:
            error = error_text(exc)
        except Exception as exc:  # an unexpected bug must still become a failed attempt
            error = error_text(exc, unexpected=True)
        return AttemptResult(
            message_id=envelope.message_id, subscription=subscription.id, attempt=attempt,
            started_at=started_at, latency_ms=(time.perf_counter() - t0) * 1000,
            status_code=status, error=error, instance=self.instance, retry_after_s=retry_after,
        )


class AiohttpSender(BaseSender):
    """aiohttp's connection pool: `max_connections` in all, no per-host limit, no
    decompression of answers (they are read and dropped)."""

    transport_errors = (aiohttp.ClientError, OSError)

    def __init__(self, *, instance: str, max_connections: int = 1000) -> None:
        super().__init__(instance=instance, max_connections=max_connections)
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        # Idle connections are closed after 4 s, before common servers close theirs (uvicorn
        # 5 s): a POST on a connection the server is closing at that moment fails without
        # reaching it, and would wait for a retry.
        connector = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=0,
                                         ttl_dns_cache=60, keepalive_timeout=4.0)
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _post(self, url: str, body: bytes, headers: dict[str, str],
                    timeout_s: float) -> tuple[int, str | None]:
        assert self._session is not None, "AiohttpSender.start() was not called"
        async with self._session.post(url, data=body, headers=headers,
                                      timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
            await response.read()
            return response.status, response.headers.get("retry-after")


def make_sender(kind: str, *, instance: str, max_connections: int = 1000) -> Sender:
    """The sender named by `kind` ("aiohttp", the default, or "httpx"), not started yet."""
    if kind == "aiohttp":
        return AiohttpSender(instance=instance, max_connections=max_connections)
    if kind == "httpx":
        from msgbus.delivery.httpx_sender import HttpxSender  # imports httpx only when chosen

        return HttpxSender(instance=instance, max_connections=max_connections)
    raise ValueError(f"unknown HTTP client {kind!r}; choose from {', '.join(SENDER_KINDS)}")
