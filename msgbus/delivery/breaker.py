"""`CircuitBreaker`: stop pushing to a subscriber that keeps failing, probe it now and then.

A subscriber that answers every push with a 5xx, times out or refuses connections gains nothing
from more pushes, and each one costs the dispatcher the CPU that healthy subscribers need. After
`threshold` such failures in a row the circuit opens: nobody pushes to it (its messages wait in
the broker, where its backlog grows) until a cooldown has passed; then one push probes it. A
success closes the circuit, a failure opens it again for the next, longer cooldown.

Failures that are about one message (other 4xx) do not count: the subscriber answered, so
they end a run of failures like a success does, without closing an open circuit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from msgbus.models import AttemptResult

log = logging.getLogger(__name__)

DEFAULT_THRESHOLD = 10
DEFAULT_COOLDOWNS_S = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
_UNHEALTHY_4XX = frozenset({408, 429})


def says_unhealthy(result: AttemptResult) -> bool:
    """A failure that tells about the subscriber, not about the message."""
    if result.ok:
        return False
    status = result.status_code
    return status is None or status >= 500 or status in _UNHEALTHY_4XX


class CircuitBreaker:
    def __init__(self, name: str, *, threshold: int = DEFAULT_THRESHOLD,
                 cooldowns_s: tuple[float, ...] = DEFAULT_COOLDOWNS_S) -> None:
        self.name = name
        self._threshold = threshold
        self._cooldowns_s = cooldowns_s
        self._failures = 0  # unhealthy failures in a row
        self._opened = 0  # times opened in a row (picks the cooldown)
        self._open_until: float | None = None  # None: closed
        self._probing = False
        self._changed = asyncio.Event()

    @property
    def is_open(self) -> bool:
        return self._open_until is not None

    async def admit(self) -> None:
        """Returns when a push may start: at once while closed; while open, after the cooldown,
        and then only one push (the probe) until it has an outcome."""
        while self._open_until is not None:
            wait_s = self._open_until - time.monotonic()
            if wait_s <= 0 and not self._probing:
                self._probing = True
                return
            self._changed.clear()
            timeout = max(wait_s, 0.0) if not self._probing else None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout)

    def forgo(self) -> None:
        """A push that `admit()` let through was not made: if it was the probe, the next
        push probes instead."""
        if self._probing:
            self._probing = False
            self._changed.set()

    def record(self, result: AttemptResult) -> None:
        """The outcome of a push that `admit()` let through."""
        probe, self._probing = self._probing, False
        if not says_unhealthy(result):
            self._failures = 0
            if self._open_until is not None and (result.ok or probe):
                log.info("%s: subscriber healthy again, circuit closed", self.name)
                self._open_until, self._opened = None, 0
            self._changed.set()
            return
        self._failures += 1
        if probe or (self._open_until is None and self._failures >= self._threshold):
            cooldown = self._cooldowns_s[min(self._opened, len(self._cooldowns_s) - 1)]
            self._opened += 1
            self._open_until = time.monotonic() + cooldown
            log.warning("%s: %d failures in a row (last: %s); circuit open, next probe in "
                        "%.0f s", self.name, self._failures, result.error, cooldown)
            self._changed.set()
