"""When to try the receiver again: a pure backoff function and the shared receiver health.

Delivery paths (inline send, group committer, resender) report every outcome to one
`ReceiverHealth`; while it is backing off, send() leaves new messages to the resender instead of
POSTing them, so an outage never slows send() down beyond one failed attempt.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from msgbus_client.settings import ClientSettings


def compute_backoff_s(
    failures: int,
    base_s: float,
    max_s: float,
    rand: Callable[[], float] = random.random,
) -> float:
    """Exponential backoff, equal jitter: a value in [c/2, c), c = min(max_s, base_s * 2**(n-1))."""
    if failures <= 0:
        return 0.0
    ceiling = min(max_s, base_s * 2.0 ** min(failures - 1, 62))
    return ceiling / 2 + rand() * ceiling / 2


def retry_delay_s(
    failures: int,
    retry_after_s: float | None,
    *,
    base_s: float,
    max_s: float,
    max_retry_after_s: float,
    rand: Callable[[], float] = random.random,
) -> float:
    """The wait before the next attempt. A receiver's Retry-After wins over our own backoff
    (capped at max_retry_after_s, plus up to 10% jitter so clients do not return in lockstep)."""
    if retry_after_s is not None:
        return min(retry_after_s, max_retry_after_s) * (1 + rand() / 10)
    return compute_backoff_s(failures, base_s, max_s, rand)


class ReceiverHealth:
    """Consecutive failures and the earliest time to try again. Thread-safe."""

    def __init__(self, *, base_s: float, max_s: float, max_retry_after_s: float) -> None:
        self._base_s = base_s
        self._max_s = max_s
        self._max_retry_after_s = max_retry_after_s
        self._lock = threading.Lock()
        self.failures = 0
        self._retry_at = 0.0  # time.monotonic()

    @classmethod
    def for_settings(cls, settings: ClientSettings) -> ReceiverHealth:
        return cls(
            base_s=settings.retry_base_s,
            max_s=settings.retry_max_s,
            max_retry_after_s=settings.max_retry_after_s,
        )

    def record_success(self) -> bool:
        """Returns True when this ends a run of failures."""
        with self._lock:
            recovered = self.failures > 0
            self.failures = 0
            self._retry_at = 0.0
            return recovered

    def record_failure(self, retry_after_s: float | None = None) -> float:
        """Returns the delay until the next attempt.

        Failures reported while already backing off (concurrent requests of the same burst)
        do not grow the backoff; only a failed attempt after the wait does.
        """
        with self._lock:
            now = time.monotonic()
            if now < self._retry_at and retry_after_s is None:
                return self._retry_at - now
            if now >= self._retry_at:
                self.failures += 1
            delay = retry_delay_s(
                self.failures,
                retry_after_s,
                base_s=self._base_s,
                max_s=self._max_s,
                max_retry_after_s=self._max_retry_after_s,
            )
            self._retry_at = max(self._retry_at, now + delay)
            return self._retry_at - now

    def wait_s(self) -> float:
        """Seconds until the next attempt is due (0 when it is due now)."""
        with self._lock:
            return max(0.0, self._retry_at - time.monotonic())

    def backing_off(self) -> bool:
        return self.wait_s() > 0


MIN_FLUSH_REQUEST_S = 0.05  # a flush near its deadline still gives a request this long


def flush_wait_s(health: ReceiverHealth, deadline: float) -> float | None:
    """The wait before the next attempt of a flush that must end by `deadline`
    (time.monotonic()); None when waiting would reach the deadline: give up then."""
    wait = health.wait_s()
    return None if wait >= deadline - time.monotonic() else wait


def flush_request_timeout_s(deadline: float) -> float:
    """A request timeout that ends a flush's request by its deadline."""
    return max(MIN_FLUSH_REQUEST_S, deadline - time.monotonic())
