"""HTTP senders (sync and async) for the receiver. They never raise: every attempt, including a
refused connection or a timeout, becomes a `PostResult`."""

from __future__ import annotations

import email.utils
import logging
import time
from datetime import UTC, datetime

import httpx

from msgbus_client._version import __version__
from msgbus_client.protocol import PostResult, PreparedRequest

log = logging.getLogger("msgbus_client")


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


class HttpSender:
    """Blocking POSTs over one pooled httpx.Client (safe to share between threads)."""

    def __init__(
        self,
        receiver_url: str,
        api_key: str,
        *,
        request_timeout_s: float,
        connect_timeout_s: float,
        max_connections: int = 100,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._request_timeout_s = request_timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._client = httpx.Client(
            base_url=receiver_url,
            headers=_headers(api_key),
            timeout=_timeout(request_timeout_s, connect_timeout_s),
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
            transport=transport,
        )

    def post(self, request: PreparedRequest, timeout_s: float | None = None) -> PostResult:
        timeout = _timeout(
            min(timeout_s or self._request_timeout_s, self._request_timeout_s),
            self._connect_timeout_s,
        )
        started = time.monotonic()
        try:
            response = self._client.post(request.path, content=request.body, timeout=timeout)
        except Exception as exc:  # the sender never raises: a failure is a result
            return _failure(request, exc)
        log.debug(
            "msgbus_client: POST %s (%d messages) -> %d in %.1f ms",
            request.path,
            len(request.entries),
            response.status_code,
            (time.monotonic() - started) * 1000,
        )
        return _result(response)

    def close(self) -> None:
        self._client.close()


class AsyncHttpSender:
    """Non-blocking POSTs over one pooled httpx.AsyncClient."""

    def __init__(
        self,
        receiver_url: str,
        api_key: str,
        *,
        request_timeout_s: float,
        connect_timeout_s: float,
        max_connections: int = 100,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._request_timeout_s = request_timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._client = httpx.AsyncClient(
            base_url=receiver_url,
            headers=_headers(api_key),
            timeout=_timeout(request_timeout_s, connect_timeout_s),
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
            transport=transport,
        )

    async def post(self, request: PreparedRequest, timeout_s: float | None = None) -> PostResult:
        timeout = _timeout(
            min(timeout_s or self._request_timeout_s, self._request_timeout_s),
            self._connect_timeout_s,
        )
        started = time.monotonic()
        try:
            response = await self._client.post(request.path, content=request.body, timeout=timeout)
        except Exception as exc:  # the sender never raises: a failure is a result
            return _failure(request, exc)
        log.debug(
            "msgbus_client: POST %s (%d messages) -> %d in %.1f ms",
            request.path,
            len(request.entries),
            response.status_code,
            (time.monotonic() - started) * 1000,
        )
        return _result(response)

    async def aclose(self) -> None:
        await self._client.aclose()
