"""`AdjustableSlots`: a semaphore whose size changes while it is in use — this process's share
of a subscription's concurrency cap, which `CapShares` moves as other instances come and go;
`RateSlots`: the same for its share of the subscription's rate.

asyncio.Semaphore cannot shrink: its counter would have to go below zero. Here the limit is
a number beside the count of slots in use; a smaller limit takes effect as slots are released.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol


class Share(Protocol):
    """What `CapShares` needs of a process's share of one limit of a subscription."""

    @property
    def limit(self) -> int: ...

    @property
    def in_use(self) -> int: ...

    @property
    def waiting(self) -> int: ...

    def set_limit(self, limit: int) -> None: ...


class _Limited:
    def __init__(self, limit: int, on_wait: Callable[[], None] | None) -> None:
        """`on_wait` is called when an acquire has to wait (e.g. to ask for a larger share
        now rather than at the next heartbeat)."""
        self._limit = limit
        self._on_wait = on_wait

    @property
    def limit(self) -> int:
        return self._limit


class AdjustableSlots(_Limited):
    def __init__(self, limit: int = 0, *, on_wait: Callable[[], None] | None = None) -> None:
        super().__init__(limit, on_wait)
        self._in_use = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def in_use(self) -> int:
        return self._in_use

    @property
    def waiting(self) -> int:
        return sum(1 for w in self._waiters if not w.done())

    def set_limit(self, limit: int) -> None:
        self._limit = max(0, limit)
        self._grant()

    async def acquire(self) -> None:
        if self._in_use < self._limit and not self._waiters:
            self._in_use += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        if self._on_wait is not None:
            self._on_wait()
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # granted as the wait was cancelled: give it back
            else:  # `_grant` may have dropped it already
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        self._in_use -= 1
        self._grant()

    def _grant(self) -> None:
        while self._waiters and self._in_use < self._limit:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self._in_use += 1
                waiter.set_result(None)


class RateSlots(_Limited):
    """At most `limit` pushes begin within any `window_s`: this process's share of a
    subscription's max_rate_per_s. `in_use` is how many began within the last window, which is
    what a process must keep recording as its share after lowering it (a sliding window, so
    that the shares of all processes add up to the rate in any window, not only on average)."""

    def __init__(self, limit: int = 0, *, window_s: float = 1.0,
                 on_wait: Callable[[], None] | None = None) -> None:
        super().__init__(limit, on_wait)
        self._window_s = window_s
        self._began: deque[float] = deque()
        self._waiting = 0
        self._changed = asyncio.Event()

    @property
    def in_use(self) -> int:
        self._forget_old(time.monotonic())
        return len(self._began)

    @property
    def waiting(self) -> int:
        return self._waiting

    def set_limit(self, limit: int) -> None:
        self._limit = max(0, limit)
        self._changed.set()

    async def acquire(self) -> None:
        self._waiting += 1
        try:
            while True:
                now = time.monotonic()
                self._forget_old(now)
                if len(self._began) < self._limit:
                    self._began.append(now)
                    return
                if self._limit == 0 and self._on_wait is not None:
                    self._on_wait()
                self._changed.clear()
                until_s = (self._began[0] + self._window_s - now) if self._began else None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), until_s)
        finally:
            self._waiting -= 1

    def release(self) -> None:
        """Nothing to give back: a push counts against the rate when it begins."""

    def _forget_old(self, now: float) -> None:
        while self._began and self._began[0] <= now - self._window_s:
            self._began.popleft()
