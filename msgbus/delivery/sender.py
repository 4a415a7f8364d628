"""Senders: one POST of one message to one subscriber. `push()` returns an AttemptResult and never
raises: every failure (status, timeout, connection error) is data for the retry policy.

- `Sender`: the interface the dispatcher depends on (`start`, `close`, `push`, `instance`).
- `BaseSender`: what every implementation shares — the timing, the total timeout
  (`subscription.timeout_ms`), the mapping of failures to error text, Retry-After parsing and the
  AttemptResult. An implementation only supplies `_post()` and its exception types.
- `H1Sender` (`msgbus/delivery/h1_sender.py`, the default), `AiohttpSender` (here) and
  `HttpxSender` (`msgbus/delivery/httpx_sender.py`); `make_sender(kind, instance=...)` picks one,
  from `DispatcherSettings.http_client` (`MSGBUS_DISPATCHER_HTTP_CLIENT`).

Decision (issue 10, replacing issue 5's aiohttp): **h1 is the default**. At saturation aiohttp's
client was two thirds of the dispatcher's event loop. `python -m bench.senders --runs 3 --targets
raw,aiohttp,h1` (each phase in a fresh process beside one recording subscriber on 127.0.0.1, 5 s
after 1 s warm-up, 64 in flight, asyncio's own loop; 2026-11-25, a quiet machine), min / median /
max over 3 runs:

    64 in flight   pushes/s               p50 ms            pushes/cpu-s
    raw aiohttp    14837 / 15195 / 15456  4.1 / 4.1 / 4.2   14893 / 15393 / 15505
    AiohttpSender  11527 / 11680 / 12126  5.2 / 5.4 / 5.5   11545 / 11763 / 12221
    H1Sender       34000 / 34776 / 35322  1.8 / 1.8 / 1.8   34881 / 35692 / 36364

H1Sender pushes 2.29x raw aiohttp (paired per run, 2.20-2.38) and ~3x AiohttpSender per
CPU-second, with the same signed headers, timeout and AttemptResult. aiohttp stays available.

Issue 5's figures (a loaded machine, 64 in flight, medians): AiohttpSender 2,841 pushes/s and
3,533 per CPU-second; HttpxSender 118 and 136: httpcore's pool re-scans every connection for
every queued request, so its CPU goes to bookkeeping, not to HTTP. httpx stays available but is
not fit for the dispatcher's load.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from typing import Protocol, get_args

import aiohttp

from msgbus.delivery.headers import push_headers
from msgbus.models import AttemptResult, Envelope, Subscription, utcnow
from msgbus.settings import HttpClient

ERROR_TEXT_MAX = 500
SENDER_KINDS: tuple[str, ...] = get_args(HttpClient)


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
    """The sender named by `kind` ("h1", the default, "aiohttp" or "httpx"), not started yet."""
    if kind == "aiohttp":
        return AiohttpSender(instance=instance, max_connections=max_connections)
    if kind == "httpx":
        from msgbus.delivery.httpx_sender import HttpxSender  # imports httpx only when chosen

        return HttpxSender(instance=instance, max_connections=max_connections)
    if kind == "h1":
        from msgbus.delivery.h1_sender import H1Sender

        return H1Sender(instance=instance, max_connections=max_connections)
    raise ValueError(f"unknown HTTP client {kind!r}; choose from {', '.join(SENDER_KINDS)}")
