"""HTTP senders (sync and async) for the receiver. They never raise: every attempt, including a
refused connection or a timeout, becomes a `PostResult`."""

from __future__ import annotations

import email.utils
import logging
import time
from abc import ABC, abstractmethod
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Generic, TypedDict, TypeVar

import httpx

from msgbus_client._version import __version__
from msgbus_client.protocol import PostResult, PreparedRequest

if TYPE_CHECKING:
    from msgbus_client.settings import ClientSettings

log = logging.getLogger("msgbus_client")

TransportT = TypeVar("TransportT", httpx.BaseTransport, httpx.AsyncBaseTransport)


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or HTTP-date); None if absent/invalid."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _headers(api_key: str) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {api_key}",
        "Content-Type": "application/json",
        "User-Agent": f"msgbus-client/{__version__}",
    }


def _timeout(request_timeout_s: float, connect_timeout_s: float) -> httpx.Timeout:
    return httpx.Timeout(request_timeout_s, connect=min(connect_timeout_s, request_timeout_s))


def _limits(max_connections: int) -> httpx.Limits:
    return httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)


def _result(response: httpx.Response) -> PostResult:
    return PostResult(
        status=response.status_code,
        body=response.content,
        retry_after_s=parse_retry_after(response.headers.get("retry-after")),
    )


def _failure(request: PreparedRequest, exc: Exception) -> PostResult:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    log.debug("msgbus_client: POST %s failed: %s", request.path, text)
    return PostResult(status=None, error=text)


class _ClientOptions(TypedDict):
    base_url: str
    headers: dict[str, str]
    timeout: httpx.Timeout
    limits: httpx.Limits


class _SenderBase(ABC, Generic[TransportT]):
    """What the sync and async senders share: client options, per-attempt timeout, logging.
    A flavour only opens its httpx client (`_open`) and makes the blocking or awaited call."""

    def __init__(
        self, settings: ClientSettings, api_key: str, *, max_connections: int | None = None,
        transport: TransportT | None = None,
    ) -> None:
        """`max_connections` defaults to one per inline send() at once, plus the resender's."""
        self._request_timeout_s = settings.request_timeout_s
        self._connect_timeout_s = settings.connect_timeout_s
        if max_connections is None:
            max_connections = settings.max_inline_requests + 1
        options = _ClientOptions(
            base_url=settings.receiver_url,
            headers=_headers(api_key),
            timeout=_timeout(self._request_timeout_s, self._connect_timeout_s),
            limits=_limits(max_connections),
        )
        self._open(options, transport)

    @abstractmethod
    def _open(self, options: _ClientOptions, transport: TransportT | None) -> None:
        """Create this flavour's pooled httpx client."""

    def _attempt_timeout(self, timeout_s: float | None) -> httpx.Timeout:
        """`timeout_s` (e.g. what close() has left) caps the request timeout, never raises it."""
        return _timeout(
            min(timeout_s or self._request_timeout_s, self._request_timeout_s),
            self._connect_timeout_s,
        )

    @staticmethod
    def _answered(request: PreparedRequest, response: httpx.Response, started: float) -> PostResult:
        log.debug(
            "msgbus_client: POST %s (%d messages) -> %d in %.1f ms",
            request.path,
            len(request.entries),
            response.status_code,
            (time.monotonic() - started) * 1000,
        )
        return _result(response)


class HttpSender(_SenderBase[httpx.BaseTransport]):
    """Blocking POSTs over one pooled httpx.Client (safe to share between threads)."""

    _client: httpx.Client

    def _open(self, options: _ClientOptions, transport: httpx.BaseTransport | None) -> None:
        self._client = httpx.Client(transport=transport, **options)

    def post(self, request: PreparedRequest, timeout_s: float | None = None) -> PostResult:
        started = time.monotonic()
        try:
            response = self._client.post(
                request.path, content=request.body, timeout=self._attempt_timeout(timeout_s)
            )
        except Exception as exc:  # the sender never raises: a failure is a result
            return _failure(request, exc)
        return self._answered(request, response, started)

    def get(self, path: str) -> PostResult:
        """A GET of the receiver's API (the payload schema); never raises either."""
        try:
            return _result(self._client.get(path))
        except Exception as exc:
            return PostResult(status=None, error=f"{type(exc).__name__}: {exc}")

    def close(self) -> None:
        self._client.close()


class AsyncHttpSender(_SenderBase[httpx.AsyncBaseTransport]):
    """Non-blocking POSTs over one pooled httpx.AsyncClient."""

    _client: httpx.AsyncClient

    def _open(self, options: _ClientOptions, transport: httpx.AsyncBaseTransport | None) -> None:
        self._client = httpx.AsyncClient(transport=transport, **options)

    async def post(self, request: PreparedRequest, timeout_s: float | None = None) -> PostResult:
        started = time.monotonic()
        try:
            response = await self._client.post(
                request.path, content=request.body, timeout=self._attempt_timeout(timeout_s)
            )
        except Exception as exc:  # the sender never raises: a failure is a result
            return _failure(request, exc)
        return self._answered(request, response, started)

    async def get(self, path: str) -> PostResult:
        """A GET of the receiver's API (the payload schema); never raises either."""
        try:
            return _result(await self._client.get(path))
        except Exception as exc:
            return PostResult(status=None, error=f"{type(exc).__name__}: {exc}")

    async def aclose(self) -> None:
        await self._client.aclose()
