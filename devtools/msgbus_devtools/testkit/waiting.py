"""How tests wait: by polling a condition until it holds, never by sleeping for it.

`wait_until` blocks (tests that drive a bus in a background loop, scripts); `eventually` awaits
(tests running on the event loop). Both poll `condition()` every `interval_s`, return its
first truthy value, and fail with `what` after `timeout_s`."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any


class _Deadline:
    def __init__(self, timeout_s: float, what: str) -> None:
        self._at = time.monotonic() + timeout_s
        self._message = f"timed out after {timeout_s}s waiting for {what}"

    def check(self) -> None:
        if time.monotonic() > self._at:
            raise AssertionError(self._message)


def wait_until(condition: Callable[[], Any], timeout_s: float = 30, what: str = "condition",
               interval_s: float = 0.05) -> Any:
    """Poll until `condition()` is truthy and return it; fail after `timeout_s`."""
    deadline = _Deadline(timeout_s, what)
    while not (value := condition()):
        deadline.check()
        time.sleep(interval_s)
    return value


async def eventually(condition: Callable[[], Any], timeout_s: float = 15,
                     what: str = "condition", interval_s: float = 0.05) -> Any:
    """In async tests: poll until `condition()` (or what it returns, when that is awaitable:
    e.g. a MongoDB query) is truthy and return it; fail after `timeout_s`."""
    deadline = _Deadline(timeout_s, what)
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        deadline.check()
        await asyncio.sleep(interval_s)
