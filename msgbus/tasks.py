"""Tasks a caller may stop waiting for without cancelling them."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


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
