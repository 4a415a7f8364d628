"""The push interface: one POST of one message to one subscriber. `push()` returns an
AttemptResult and never raises: every failure (status, timeout, connection error) is data for
the retry policy.

- `Sender`: what the dispatcher, the compensator and the admin's test push depend on (`start`,
  `close`, `push`, `push_batch`, `instance`).
- `BaseSender`: what every implementation shares: the timing, the total timeout
  (`subscription.timeout_ms`), the mapping of failures to error text, Retry-After parsing and the
  AttemptResult. An implementation supplies only `_post()` and its exception types.

The implementations, `H1Sender` (the default: a lean HTTP/1.1 client, several times aiohttp's
pushes per CPU-second) and `AiohttpSender` (the fallback), are in their own modules;
`msgbus.delivery.senders.make_sender` picks one by `MSGBUS_DISPATCHER_HTTP_CLIENT`. Figures:
`python -m bench.senders`, results in bench/RESULTS.md.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Protocol, get_args

from msgbus import __version__, telemetry
from msgbus.delivery.authenticator import PushAuthenticator, PushAuthError
from msgbus.delivery.batch import BatchPush, batch_headers
from msgbus.delivery.headers import plain, push_headers
from msgbus.delivery.proxy import PushProxy
from msgbus.egress import EgressPolicy
from msgbus.models import AttemptResult, Envelope, Subscription, utcnow
from msgbus.push_credentials import PushAuth
from msgbus.sealing import SecretKeys
from msgbus.settings import HttpClient

ERROR_TEXT_MAX = 500
SENDER_KINDS: tuple[str, ...] = get_args(HttpClient)


USER_AGENT = f"msgbus/{__version__}"  # every push client's, so subscribers see who calls

class Sender(Protocol):
    """Pushes one message to one subscriber; `push()` never raises (failures are data)."""

    instance: str

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def push(self, envelope: Envelope, subscription: Subscription,
                   attempt: int) -> AttemptResult: ...

    async def push_batch(self, batch: BatchPush,
                         subscription: Subscription) -> list[AttemptResult]: ...

    async def post(self, url: str, body: bytes, headers: dict[str, str],
                   timeout_s: float) -> tuple[int | None, str | None]: ...


def retry_after_s(value: str | None) -> float | None:
    """A Retry-After header in seconds; None when absent or an HTTP date (rare for webhooks: the
    policy's own delay applies)."""
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def timeout_text(timeout_s: float) -> str:
    return f"timeout after {round(timeout_s * 1000)} ms"


def error_text(exc: BaseException, *, unexpected: bool = False) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return (f"unexpected {text}" if unexpected else text)[:ERROR_TEXT_MAX]


def answer_text(kept: bytes | None) -> str | None:
    """The kept bytes of an answer as text (a character the cut split becomes U+FFFD); None
    for none. Untrusted: whoever shows it escapes it."""
    if not kept:
        return None
    return kept.decode("utf-8", "replace")


class BaseSender(ABC):
    """The shared `push()`: implementations supply `_post()`, `start()`, `close()` and which of
    their exceptions are timeouts and which are transport (connection, protocol) errors."""

    timeout_errors: tuple[type[BaseException], ...] = (TimeoutError,)
    transport_errors: tuple[type[BaseException], ...] = (OSError,)

    def __init__(self, *, instance: str, max_connections: int = 1000,
                 answer_keep_bytes: int = 1024, egress: EgressPolicy | None = None,
                 keys: SecretKeys | None = None, proxy: PushProxy | None = None) -> None:
        self.instance = instance
        self.max_connections = max_connections
        # how much of the answer to a failed push `_post` keeps (0: none)
        self.answer_keep_bytes = answer_keep_bytes
        # where pushes may connect: every implementation connects only to an address it allows
        self.egress = egress or EgressPolicy()
        # open the sealed signing secrets (msgbus/sealing.py); without keys, plain ones only
        self.open_secret = keys.open if keys is not None else plain
        # the subscriptions' own authentication (headers, OAuth2 tokens, TLS client certificates)
        self.proxy = proxy  # the company's HTTP proxy (msgbus/delivery/proxy.py), if any
        self.authenticator = PushAuthenticator(self.open_secret, self.egress, USER_AGENT, proxy)

    @abstractmethod
    async def start(self) -> None: ...

    async def close(self) -> None:
        await self.authenticator.close()

    @abstractmethod
    async def _post(self, url: str, body: bytes, headers: dict[str, str],
                    timeout_s: float, tls: ssl.SSLContext | None = None
                    ) -> tuple[int, str | None, bytes | None]:
        """POST within `timeout_s` in total, read the whole answer; return its status, its
        Retry-After header (or None) and, for a status other than 2xx, the first
        `answer_keep_bytes` of its body (None when 0). `tls`: the context of an https URL
        (None: the default one). Raises on a timeout or a transport error."""

    async def push(self, envelope: Envelope, subscription: Subscription,
                   attempt: int) -> AttemptResult:
        started_at = utcnow()
        t0 = time.perf_counter()
        with telemetry.push_span(envelope, subscription, attempt) as trace:
            status, error, retry_after, answer = await self._answer_of(
                str(subscription.url), envelope.body,
                lambda: push_headers(envelope, subscription, attempt, trace.traceparent,
                                     self.open_secret),
                subscription.timeout_ms / 1000, subscription.auth)
            trace.answered(status, error)
        return AttemptResult(
            message_id=envelope.message_id, subscription=subscription.id, attempt=attempt,
            started_at=started_at, latency_ms=(time.perf_counter() - t0) * 1000,
            status_code=status, error=error, instance=self.instance, retry_after_s=retry_after,
            answer=answer,
        )

    async def push_batch(self, batch: BatchPush,
                         subscription: Subscription) -> list[AttemptResult]:
        """One POST of the batch's body; the answer is each of its messages' result."""
        started_at = utcnow()
        t0 = time.perf_counter()
        body = batch.body
        with telemetry.batch_span("msgbus push", batch.envelopes):
            status, error, retry_after, answer = await self._answer_of(
                str(subscription.url), body,
                lambda: batch_headers(batch, subscription, body, self.open_secret),
                subscription.timeout_ms / 1000, subscription.auth)
        latency_ms = (time.perf_counter() - t0) * 1000
        return [AttemptResult(
            message_id=envelope.message_id, subscription=subscription.id, attempt=attempt,
            started_at=started_at, latency_ms=latency_ms, status_code=status, error=error,
            instance=self.instance, retry_after_s=retry_after, batch_id=batch.batch_id,
            answer=answer)
            for envelope, attempt in zip(batch.envelopes, batch.attempts, strict=True)]

    async def post(self, url: str, body: bytes, headers: dict[str, str],
                   timeout_s: float) -> tuple[int | None, str | None]:
        """A POST that is not a push of messages (a team's notification): (status, error text),
        never raising, under the same egress policy."""
        status, error, _, _ = await self._answer_of(url, body, lambda: headers, timeout_s)
        return status, error

    async def _answer_of(self, url: str, body: bytes, headers: Callable[[], dict[str, str]],
                         timeout_s: float, auth: PushAuth | None = None
                         ) -> tuple[int | None, str | None, float | None, str | None]:
        """One POST: (status, error text, Retry-After s, the kept answer). Headers are made
        inside, so that an error making them (a bad secret, a token endpoint down) is a failed
        attempt too. A 401 to an OAuth2 push is pushed once more with a new token."""
        status: int | None = None
        try:
            status, retry_after_header, kept = await self._authenticated_post(
                url, body, headers(), timeout_s, auth)
            if not 200 <= status < 300:
                return (status, f"HTTP {status}", retry_after_s(retry_after_header),
                        answer_text(kept))
            return status, None, None, None
        except asyncio.CancelledError:
            raise
        except PushAuthError as exc:
            return status, str(exc)[:ERROR_TEXT_MAX], None, None
        except self.timeout_errors:  # before transport_errors: TimeoutError is an OSError
            return status, timeout_text(timeout_s), None, None
        except self.transport_errors as exc:
            return status, error_text(exc), None, None
        except Exception as exc:  # an unexpected bug must still become a failed attempt
            return status, error_text(exc, unexpected=True), None, None

    async def _authenticated_post(self, url: str, body: bytes, headers: dict[str, str],
                                  timeout_s: float, auth: PushAuth | None
                                  ) -> tuple[int, str | None, bytes | None]:
        if auth is None:
            return await self._post(url, body, headers, timeout_s)
        tls = self.authenticator.tls(auth)
        sent = headers | await self.authenticator.headers(auth)
        answer = await self._post(url, body, sent, timeout_s, tls)
        if answer[0] == 401 and self.authenticator.rejected(auth, sent):
            sent = headers | await self.authenticator.headers(auth)
            answer = await self._post(url, body, sent, timeout_s, tls)
        return answer
