"""Event-loop helpers: tasks a caller may stop waiting for without cancelling them, and
batch work that yields to the loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

# Items mapped between two yields to the event loop by `map_cooperatively`: a few µs each
# (decoding an envelope or an outcome, building a MongoDB document), so a chunk holds the loop
# well under a millisecond.
COOPERATIVE_CHUNK = 64


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


async def map_cooperatively(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """`[fn(item) for item in items]`, yielding to the event loop between chunks: a batch of
    hundreds of messages must not hold up the loop's other work (answers to producers,
    pushes) for tens of milliseconds."""
    out: list[R] = []
    for start in range(0, len(items), COOPERATIVE_CHUNK):
        if start:
            await asyncio.sleep(0)
        out += map(fn, items[start : start + COOPERATIVE_CHUNK])
    return out
