"""`CircuitBreaker`: stop pushing to a subscriber that seems down, probe it now and then.

A subscriber that answers every push with a 5xx, times out or refuses connections gains nothing
from more pushes, and each one costs the dispatcher the CPU that healthy subscribers need. The
circuit opens (`CircuitPolicy`) when `open_after_failures` pushes of different messages failed
in a way that says the subscriber is unwell since it last answered, and it has not answered
for `alive_window_s`. Then nobody pushes to it (its messages wait in the broker or in the
retry queue) until a cooldown has passed; then one push probes it. A success closes the
circuit, a failure opens it again for the next, longer cooldown.

One circuit per subscription, whoever pushes: every process (dispatchers, compensators with
their retries and replays) keeps one breaker per subscription and reports its evidence (its
last success and answer, its failures since the last answer anywhere) with its heartbeat
(`msgbus.delivery.shares`); each breaker hears the others' reports (`hear`). So a success
anywhere counts: a retry that succeeds in a compensator keeps the dispatchers' circuit closed,
and closes it where it is open; and failures seen anywhere open it everywhere within a
heartbeat. Failures that are about one message do not count: only a message's first push
counts (a retry that fails is the same message failing again, and its retry schedule already
backs off), a message counts once, and other 4xx are answers (the subscriber is up, the message
is refused). Probes count whatever they push: a failed probe reopens the circuit for longer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from msgbus.models import AttemptResult, CircuitPolicy

log = logging.getLogger(__name__)

_UNHEALTHY_4XX = frozenset({408, 429})
MAX_FAILURES_KEPT = 10_000  # message ids remembered per subscription between answers


def says_unhealthy(result: AttemptResult) -> bool:
    """A failure that tells about the subscriber, not about the message."""
    if result.ok:
        return False
    status = result.status_code
    return status is None or status >= 500 or status in _UNHEALTHY_4XX


@dataclass(frozen=True, slots=True)
class Evidence:
    """What one process saw of a subscriber (wall-clock seconds; 0: never)."""

    ok_at: float = 0.0  # its newest success
    answered_at: float = 0.0  # its newest answer: a success or a refusal of one message
    failures: int = 0  # unwell failures of different messages since `counted_since`
    counted_since: float = 0.0  # the newest answer anywhere that process knew of

    def tells(self) -> bool:
        """Whether it says anything to the others: with no answer and no failure its
        `counted_since` counts nothing (`CircuitBreaker.hear` reads it as no report)."""
        return bool(self.ok_at or self.answered_at or self.failures)

    def to_doc(self) -> dict[str, Any]:
        return {"ok_at": self.ok_at, "answered_at": self.answered_at,
                "failures": self.failures, "counted_since": self.counted_since}

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> Evidence:
        return cls(float(doc.get("ok_at", 0)), float(doc.get("answered_at", 0)),
                   int(doc.get("failures", 0)), float(doc.get("counted_since", 0)))


class CircuitBreaker:
    def __init__(self, name: str, policy: CircuitPolicy | None = None, *,
                 on_change: Callable[[bool], None] | None = None) -> None:
        """`on_change(is_open)`: told after every transition (e.g. a gauge's set)."""
        self.name = name
        self.policy = policy or CircuitPolicy()
        self._on_change = on_change
        self._mine = Evidence()
        self._heard = Evidence()  # the other processes' evidence, summed up
        self._failed: dict[str, float] = {}  # message id -> when, since the last answer
        self._opened = 0  # times opened in a row (picks the cooldown)
        self._opened_at = 0.0  # wall clock
        self._open_until: float | None = None  # monotonic; None: closed
        self._probing = False
        self._changed = asyncio.Event()

    @property
    def is_open(self) -> bool:
        return self._open_until is not None

    # -- pushes ----------------------------------------------------------------------------

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
        now = time.time()
        if not says_unhealthy(result):
            ok_at = now if result.ok else self._mine.ok_at
            self._mine = Evidence(ok_at, now)
            self._failed.clear()
            if self.is_open and (result.ok or probe):
                self._close("it answered a push")
            self._changed.set()
            return
        if result.attempt <= 1 and len(self._failed) < MAX_FAILURES_KEPT:
            self._failed[result.message_id] = now
        if probe:
            self._open(f"the probe failed ({result.error})")
        elif not self.is_open and self._should_open(now):
            self._open(f"{self._failures()} failures since it last answered "
                       f"(last: {result.error})")

    # -- the other processes ---------------------------------------------------------------

    def report(self) -> Evidence:
        """This process's evidence, for the others (sent with the heartbeat)."""
        return Evidence(self._mine.ok_at, self._mine.answered_at, len(self._failed),
                        self._last_answered())

    def hear(self, others: list[Evidence]) -> None:
        """The other processes' latest evidence (each heartbeat)."""
        answered = max([e.answered_at for e in others], default=0.0)
        last = max(answered, self._mine.answered_at)
        # a count made since an older answer than the newest known is out of date
        failures = sum(e.failures for e in others if e.counted_since >= last)
        self._heard = Evidence(max([e.ok_at for e in others], default=0.0), answered, failures,
                               last)
        if answered > self._mine.answered_at:
            self._failed = {mid: at for mid, at in self._failed.items() if at > answered}
        if self.is_open and self._heard.ok_at > self._opened_at:
            self._close("a push elsewhere succeeded")
        elif not self.is_open and self._should_open(time.time()):
            self._open(f"{self._failures()} failures (all processes) since it last answered")

    # -- the rule --------------------------------------------------------------------------

    def _last_answered(self) -> float:
        return max(self._mine.answered_at, self._heard.answered_at)

    def _failures(self) -> int:
        return len(self._failed) + self._heard.failures

    def _should_open(self, now: float) -> bool:
        return (self._failures() >= self.policy.open_after_failures
                and now - self._last_answered() >= self.policy.alive_window_s)

    def _open(self, why: str) -> None:
        cooldowns = self.policy.cooldowns_s
        cooldown = cooldowns[min(self._opened, len(cooldowns) - 1)]
        self._opened += 1
        self._opened_at = time.time()
        self._open_until = time.monotonic() + cooldown
        log.warning("%s: %s; circuit open, next probe in %.0f s", self.name, why, cooldown)
        self._changed.set()
        self._told()

    def _close(self, why: str) -> None:
        log.info("%s: subscriber healthy again (%s), circuit closed", self.name, why)
        self._open_until, self._opened = None, 0
        self._changed.set()
        self._told()

    def _told(self) -> None:
        if self._on_change is not None:
            self._on_change(self.is_open)
