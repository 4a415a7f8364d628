"""`AdjustableSlots`: a semaphore whose size changes while it is in use — this process's share
of a subscription's concurrency cap, which `CapShares` moves as other instances come and go.

asyncio.Semaphore cannot shrink: its counter would have to go below zero. Here the limit is
a number beside the count of slots in use; a smaller limit takes effect as slots are released.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable


class AdjustableSlots:
    def __init__(self, limit: int = 0, *, on_wait: Callable[[], None] | None = None) -> None:
        """`on_wait` is called when an acquire has to wait (e.g. to ask for a larger share
        now rather than at the next heartbeat)."""
        self._limit = limit
        self._in_use = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._on_wait = on_wait

    @property
    def limit(self) -> int:
        return self._limit

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
            else:
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
