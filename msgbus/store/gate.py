"""`MongoGate`: one process's view of whether MongoDB answers, so that an outage costs the
process one timeout, not one per call.

    caller ── guard(caller, timeout_s) ──▶ gate open? ── no ──▶ MongoUnavailable at once
                                              │ yes            (the caller's outage path)
                                              ▼
                          the calls, within timeout_s (pymongo.timeout: the driver's own
                          client-side timeout, which also discards the hung connection)
                                              │ timeout or connection error
                                              ▼
                          the gate closes; one probe task pings MongoDB with backoff
                          (msgbus/backoff.py) and opens the gate at its first answer

Every MongoDB call on a message's way goes through the store's gate: the receiver's claims and
records, the dispatcher's share leases, redelivery look-ups and trace flushes, the compensator's
claims. A hung server (SIGSTOP, dropped packets) and a refused connection look alike from here:
the first costs one `timeout_s`, the second nothing, and both close the gate.

Why one gate per process and not a breaker per caller: the callers share one server, so what
one learns (MongoDB hangs) holds for all; a breaker each would make each pay its own timeout.
A slow call that still answers never closes the gate; a call that times out on a busy but live
server does, and the first probe (after PROBE_FIRST_S) opens it again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

import pymongo
from pymongo.errors import ConnectionFailure, ExecutionTimeout, PyMongoError, WTimeoutError

from msgbus.backoff import backoff_s
from msgbus.errors import MongoUnavailable
from msgbus.tasks import cancel_and_wait

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 1.0
PROBE_FIRST_S = 0.25  # the first probe after the gate closed; then twice as long, up to:
PROBE_MAX_S = 4.0
BACKSTOP_S = 1.0  # beyond the driver's timeout: an await inside a guard that is not MongoDB's


def is_outage(exc: BaseException) -> bool:
    """A timeout or a lost connection: MongoDB did not answer (not: it refused the request)."""
    if isinstance(exc, ConnectionFailure | ExecutionTimeout | WTimeoutError | TimeoutError):
        return True
    return isinstance(exc, PyMongoError) and exc.timeout


class MongoGate:
    def __init__(self, ping: Callable[[], Awaitable[Any]], *, component: str,
                 probe_timeout_s: float = PROBE_TIMEOUT_S, probe_first_s: float = PROBE_FIRST_S,
                 probe_max_s: float = PROBE_MAX_S) -> None:
        self._ping = ping
        self.component = component
        self._probe_timeout_s = probe_timeout_s
        self._probe_first_s = probe_first_s
        self._probe_max_s = probe_max_s
        self._open = asyncio.Event()
        self._open.set()
        self._since = datetime.now(UTC)
        self._reason: str | None = None
        self._closed_by: str | None = None
        self._probes = 0
        self._skipped = 0
        self._probe_task: asyncio.Task[None] | None = None
        # called with `state()` whenever the gate opens or closes (e.g. to tell another process)
        self.on_change: Callable[[dict[str, Any]], None] | None = None
        # imported here: the store is imported by the CLI, which must not import
        # prometheus_client before `msgbus receiver` sets up its multiprocess mode
        from msgbus import metrics
        self._available_gauge = metrics.MONGO_AVAILABLE.labels(component)
        self._closed_counter = metrics.MONGO_GATE_CLOSED.labels(component)
        self._skipped_counter = metrics.MONGO_CALLS_SKIPPED
        self._available_gauge.set(1)

    @property
    def available(self) -> bool:
        return self._open.is_set()

    def guard(self, caller: str, timeout_s: float) -> Guarded:
        """`async with gate.guard("claims", 2.0): ...`: MongoUnavailable at once while the gate
        is closed; else the block's MongoDB calls share `timeout_s`, and a timeout or a lost
        connection closes the gate and is raised as MongoUnavailable."""
        return Guarded(self, caller, timeout_s)

    async def wait_available(self) -> None:
        """Returns once the gate is open (at once when it is)."""
        await self._open.wait()

    def refuse(self, caller: str) -> MongoUnavailable:
        """The error a caller gets while the gate is closed (counted)."""
        self._skipped += 1
        self._skipped_counter.labels(self.component, caller).inc()
        return MongoUnavailable(f"MongoDB is unavailable since {self._since:%H:%M:%S} UTC "
                                f"({self._reason}); {caller} does not wait for it")

    def trip(self, caller: str, exc: BaseException) -> None:
        """MongoDB did not answer `caller`: close the gate and start probing."""
        if not self.available:
            return
        self._open.clear()
        self._since = datetime.now(UTC)
        self._reason = f"{type(exc).__name__}: {str(exc)[:200]}"
        self._closed_by = caller
        self._available_gauge.set(0)
        self._closed_counter.inc()
        log.warning("%s: MongoDB did not answer %s (%s); not waiting for it until a probe "
                    "answers", self.component, caller, self._reason)
        self._changed()
        if self._probe_task is None or self._probe_task.done():
            self._probe_task = asyncio.create_task(self._probe_until_open(),
                                                   name=f"mongo-probe-{self.component}")

    def state(self) -> dict[str, Any]:
        """For health endpoints: whether calls go through, since when, and why not."""
        return {"component": self.component, "available": self.available,
                "since": self._since.isoformat(),
                "closed_by": self._closed_by, "reason": self._reason, "probes": self._probes,
                "skipped_calls": self._skipped}

    async def close(self) -> None:
        await cancel_and_wait(self._probe_task)

    async def _probe_until_open(self) -> None:
        failures = 0
        began = time.monotonic()
        while not self.available:
            failures += 1
            await asyncio.sleep(backoff_s(failures=failures, first_s=self._probe_first_s,
                                          max_s=self._probe_max_s))
            self._probes += 1
            try:
                with pymongo.timeout(self._probe_timeout_s):
                    await asyncio.wait_for(self._ping(), self._probe_timeout_s + BACKSTOP_S)
            except Exception as exc:  # any failure: still unavailable
                log.debug("%s: MongoDB probe failed: %r", self.component, exc)
                continue
            self._reopen(time.monotonic() - began)

    def _reopen(self, outage_s: float) -> None:
        self._open.set()
        self._since = datetime.now(UTC)
        self._available_gauge.set(1)
        log.warning("%s: MongoDB answers again after %.1f s (closed by %s: %s)", self.component,
                    outage_s, self._closed_by, self._reason)
        self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            try:
                self.on_change(self.state())
            except Exception:  # telling others must never break the gate
                log.exception("%s: reporting the MongoDB gate's state failed", self.component)


class Guarded:
    """The block of one `MongoGate.guard` (an async context manager)."""

    def __init__(self, gate: MongoGate, caller: str, timeout_s: float) -> None:
        self._gate = gate
        self._caller = caller
        self._timeout_s = timeout_s
        self._driver_timeout: Any = None
        self._backstop: asyncio.Timeout | None = None

    async def __aenter__(self) -> None:
        if not self._gate.available:
            raise self._gate.refuse(self._caller)
        self._driver_timeout = pymongo.timeout(self._timeout_s)
        self._driver_timeout.__enter__()
        self._backstop = asyncio.timeout(self._timeout_s + BACKSTOP_S)
        await self._backstop.__aenter__()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool:
        assert self._backstop is not None
        try:
            await self._backstop.__aexit__(exc_type, exc, tb)
        except TimeoutError as timed_out:  # the backstop fired: the block's exception now
            exc = timed_out
        finally:
            self._driver_timeout.__exit__(None, None, None)
        if exc is not None and is_outage(exc):
            self._gate.trip(self._caller, exc)
            raise MongoUnavailable(f"MongoDB did not answer {self._caller} within "
                                   f"{self._timeout_s:g} s ({type(exc).__name__})") from exc
        return False
