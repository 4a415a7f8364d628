"""`TokenBucket`: a rate limit whose rate can change while it runs.

Holds at most one second of tokens, so a limit of N/s never lets more than about N through in
any second, even after an idle spell. A rate of 0 means unlimited.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable


class TokenBucket:
    def __init__(self, rate_per_s: float = 0, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._rate = 0.0
        self._tokens = 0.0
        self._updated = clock()
        self.set_rate(rate_per_s)

    @property
    def rate_per_s(self) -> float:
        return self._rate

    def set_rate(self, rate_per_s: float) -> None:
        if rate_per_s < 0:
            raise ValueError(f"a rate is >= 0 (0: unlimited); got {rate_per_s}")
        if rate_per_s != self._rate:
            self._refill()
            self._rate = float(rate_per_s)
            self._tokens = min(self._tokens, self._capacity())

    def _capacity(self) -> float:
        return max(self._rate, 1.0)

    def _refill(self) -> None:
        now = self._clock()
        if self._rate:
            self._tokens = min(self._capacity(),
                               self._tokens + (now - self._updated) * self._rate)
        self._updated = now

    def available(self) -> int:
        """Whole tokens that may be taken now (a large number when unlimited)."""
        if not self._rate:
            return 2**31
        self._refill()
        return math.floor(self._tokens)

    def take(self, count: int) -> None:
        if self._rate:
            self._refill()
            self._tokens -= count

    def wait_s(self) -> float:
        """Seconds until one token is available (0 when one is)."""
        if not self._rate:
            return 0.0
        self._refill()
        return max(0.0, (1.0 - self._tokens) / self._rate)

    async def take_one(self) -> None:
        """Waits until a token is available and takes it."""
        wait_s = self.wait_s()
        while wait_s > 0:
            await asyncio.sleep(wait_s)
            wait_s = self.wait_s()
        self.take(1)
