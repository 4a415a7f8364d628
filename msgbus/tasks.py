"""Tasks a caller may stop waiting for without cancelling them, and periodic jobs."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)


def run_on(coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """A task to await through `asyncio.shield`: a caller that gives up (a timeout) leaves it
    running instead of cancelling it mid-flight (which costs a MongoDB call its connection),
    and a failure that comes after nobody waits any more is retrieved, not reported."""
    task = asyncio.create_task(coro)
    task.add_done_callback(_retrieve_exception)
    return task


def _retrieve_exception(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


async def periodically(job: Callable[[], Awaitable[object]], interval_s: float, *, what: str,
                       max_busy: float = 1.0) -> None:
    """Runs `job` every `interval_s` until cancelled; a failure (MongoDB down) is logged and the
    job runs again next time. With `max_busy` below 1 the pause after a pass grows with the
    pass, so the job takes at most that share of the time: a gauge whose queries read a large
    backlog, or wait behind a busy MongoDB server, then backs off instead of adding to it."""
    while True:
        began = time.monotonic()
        try:
            await job()
        except Exception as exc:
            log.warning("%s failed: %s", what, exc)
        took = time.monotonic() - began
        await asyncio.sleep(max(interval_s, took * (1 - max_busy) / max_busy))
