"""Tasks a caller may stop waiting for without cancelling them, and periodic jobs."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

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


async def periodically(job: Callable[[], Awaitable[object]], interval_s: float, *, what: str,
                       max_busy: float = 1.0, max_pause_s: float | None = None,
                       ready: Callable[[], Awaitable[object]] | None = None) -> None:
    """Runs `job` every `interval_s` until cancelled; a failure (MongoDB down) is logged and the
    job runs again next time. With `max_busy` below 1 the pause after a pass grows with the
    pass, so the job takes at most that share of the time: a gauge whose queries read a large
    backlog, or wait behind a busy MongoDB server, then backs off instead of adding to it; but
    it pauses at most `max_pause_s` (default: 4 intervals), so a gauge never goes stale for
    long. With `ready` (a MongoDB gate's `wait_available`), a pass starts only once it returns."""
    longest_s = 4 * interval_s if max_pause_s is None else max_pause_s
    while True:
        if ready is not None:
            await ready()
        began = time.monotonic()
        try:
            await job()
        except Exception as exc:
            log.warning("%s failed: %s", what, exc)
        took = time.monotonic() - began
        await asyncio.sleep(max(interval_s,
                                min(longest_s, took * (1 - max_busy) / max_busy)))


@dataclass(frozen=True, slots=True)
class _Job:
    run: Callable[[], Awaitable[object]]
    interval_s: float
    what: str
    max_busy: float
    ready: Callable[[], Awaitable[object]] | None


class PeriodicWork:
    """A part whose work is jobs run every so often (`periodically`), from `start()` until
    `close()`: a subclass names them with `every()` when it is made."""

    def __init__(self) -> None:
        self._jobs: list[_Job] = []
        self._tasks: list[asyncio.Task[None]] = []

    def every(self, interval_s: float, job: Callable[[], Awaitable[object]], *, what: str,
              max_busy: float = 1.0, ready: Callable[[], Awaitable[object]] | None = None
              ) -> None:
        """`ready`: see `periodically` (the jobs that read or write MongoDB wait for its
        gate)."""
        self._jobs.append(_Job(job, interval_s, what, max_busy, ready))

    def start(self) -> None:
        self._tasks = [asyncio.create_task(
            periodically(job.run, job.interval_s, what=job.what, max_busy=job.max_busy,
                         ready=job.ready),
            name=job.what.replace(" ", "-")) for job in self._jobs]

    async def close(self) -> None:
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
