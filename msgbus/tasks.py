"""Tasks a caller may stop waiting for without cancelling them, and periodic jobs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from msgbus.errors import MongoUnavailable

T = TypeVar("T")
log = logging.getLogger(__name__)

# The share of the time the backlog and retry gauges may take. Bounded: their counts read the
# entries of a subscription's range, and a gauge must not load the MongoDB server that works a
# large backlog off, so it backs off instead (see docs/decisions.md, "Gauges that count little
# and back off").
GAUGE_MAX_BUSY = 0.25


def detached_task(coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """A task to await through `asyncio.shield`: a caller that gives up (a timeout) leaves it
    running instead of cancelling it mid-flight (which costs a MongoDB call its connection),
    and a failure that comes after nobody waits any more is retrieved, not reported."""
    task = asyncio.create_task(coro)
    task.add_done_callback(_retrieve_exception)
    return task


def _retrieve_exception(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


async def cancel_and_wait(*tasks: asyncio.Future[Any] | None, every_s: float = 1.0) -> None:
    """Cancels the tasks and waits until they have ended; re-raises a failure other than the
    cancellation. The cancellation is repeated every `every_s` while one still runs: Python
    3.11's `asyncio.wait_for` (ours and the drivers') drops a cancellation that comes as the
    awaited call completes, and a loop that lost its only one would keep its close waiting
    for ever."""
    running = {task for task in tasks if task is not None}
    pending = running
    while pending:
        for task in pending:
            task.cancel()
        pending = (await asyncio.wait(pending, timeout=every_s))[1]
    for task in running:
        if not task.cancelled() and task.exception() is not None:
            task.result()


Interval = float | Callable[[], float]  # seconds, or a function that says them at each pause


async def periodically(job: Callable[[], Awaitable[object]], interval_s: Interval, *, what: str,
                       max_busy: float = 1.0, max_pause_s: float | None = None,
                       ready: Callable[[], Awaitable[object]] | None = None,
                       wake: asyncio.Event | None = None, first_pause: bool = False,
                       again_while_busy: bool = False,
                       closing: asyncio.Event | None = None) -> None:
    """Runs `job` every `interval_s` until cancelled (or `closing` is set); a failure (MongoDB
    down) is logged and the job runs again next time. With `max_busy` below 1 the pause after a
    pass grows with the pass, so the job takes at most that share of the time: a gauge whose
    queries read a large backlog, or wait behind a busy MongoDB server, then backs off instead
    of adding to it; but it pauses at most `max_pause_s` (default: 4 intervals), so a gauge
    never goes stale for long. With `ready` (a MongoDB gate's `wait_available`), a pass starts
    only once it returns. `wake`, when set, ends a pause at once (it is cleared then).
    `first_pause`: the first pass comes after an interval, not at once. `again_while_busy`: a
    pass that returns a true value (it found work) is followed by the next at once."""
    if first_pause:
        await _pause(_seconds(interval_s), wake)
    while closing is None or not closing.is_set():
        if ready is not None:
            await ready()
        began = time.monotonic()
        try:
            busy = await job()
        except Exception as exc:
            # an outage is expected and said in one line; anything else gets its traceback
            log.warning("%s failed: %s", what, exc, exc_info=not _is_outage(exc))
            busy = False
        if again_while_busy and busy:
            await asyncio.sleep(0)  # a pass that found work without awaiting starves no task
            continue
        took = time.monotonic() - began
        every_s = _seconds(interval_s)
        longest_s = 4 * every_s if max_pause_s is None else max_pause_s
        await _pause(max(every_s, min(longest_s, took * (1 - max_busy) / max_busy)), wake)


def _is_outage(exc: Exception) -> bool:
    return isinstance(exc, MongoUnavailable | ConnectionError | TimeoutError)


def _seconds(interval_s: Interval) -> float:
    return interval_s() if callable(interval_s) else interval_s


async def _pause(seconds: float, wake: asyncio.Event | None) -> None:
    if wake is None:
        await asyncio.sleep(seconds)
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(wake.wait(), seconds)
    wake.clear()


@dataclass(frozen=True, slots=True)
class _Job:
    run: Callable[[], Awaitable[object]]
    interval_s: Interval
    what: str
    max_busy: float
    ready: Callable[[], Awaitable[object]] | None
    wake: asyncio.Event
    first_pause: bool
    again_while_busy: bool


class PeriodicWork:
    """A part whose work is jobs run every so often (`periodically`), from `start()` until
    `close()`: a subclass names them with `every()` when it is made (a part whose start or
    close does more holds one instead). `_closing` is set by `close()`: a pass that may take
    long watches it to end early."""

    def __init__(self, *, close_grace_s: float = 0.0) -> None:
        """`close_grace_s`: how long a pass under way at `close()` may take to end (it sees
        `_closing`) before it is cancelled."""
        self._jobs: list[_Job] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = asyncio.Event()
        self._close_grace_s = close_grace_s

    def every(self, interval_s: Interval, job: Callable[[], Awaitable[object]], *, what: str,
              max_busy: float = 1.0, ready: Callable[[], Awaitable[object]] | None = None,
              wake: asyncio.Event | None = None, first_pause: bool = False,
              again_while_busy: bool = False) -> None:
        """See `periodically` (the jobs that read or write MongoDB wait for its gate with
        `ready`). `what` names the job in its log lines and its task."""
        self._jobs.append(_Job(job, interval_s, what, max_busy, ready,
                               asyncio.Event() if wake is None else wake, first_pause,
                               again_while_busy))

    def start(self) -> None:
        self._tasks = [asyncio.create_task(
            periodically(job.run, job.interval_s, what=job.what, max_busy=job.max_busy,
                         ready=job.ready, wake=job.wake, first_pause=job.first_pause,
                         again_while_busy=job.again_while_busy, closing=self._closing),
            name=job.what.replace(" ", "-")) for job in self._jobs]

    async def close(self) -> None:
        self._closing.set()
        for job in self._jobs:
            job.wake.set()  # ends its pause: a loop that lost its cancellation stops at once
        if self._close_grace_s > 0 and self._tasks:
            await asyncio.wait(self._tasks, timeout=self._close_grace_s)
        await cancel_and_wait(*self._tasks)


CloseStep = tuple[str, Callable[[], Awaitable[object]]]


async def close_in_order(component: str, steps: Sequence[CloseStep], *,
                         slow_s: float = 15.0) -> None:
    """Runs a service's close steps one after the other. A step still running after `slow_s`
    (and every `slow_s` after) is said, so that a close that hangs says where."""
    for what, close in steps:
        task = asyncio.ensure_future(close())
        waited_s = 0.0
        try:
            while not (await asyncio.wait({task}, timeout=slow_s))[0]:
                waited_s += slow_s
                log.warning("closing the %s: its %s still not closed after %.0f s", component,
                            what, waited_s)
        except asyncio.CancelledError:
            task.cancel()
            raise
        task.result()
