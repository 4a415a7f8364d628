"""`SubscriptionLimiter`: what stands between a message and a push to its subscriber — the
subscription's circuit breaker and this process's slots of its concurrency cap (its share of
`max_concurrency`, `msgbus.delivery.shares`), with their metrics. The dispatcher and the
compensator each hold one per subscription."""

from __future__ import annotations

import asyncio
import time

from msgbus.delivery.breaker import CircuitBreaker
from msgbus.delivery.slots import AdjustableSlots, RateSlots
from msgbus.metrics import IN_FLIGHT, SLOT_WAIT
from msgbus.models import AttemptResult


class SubscriptionLimiter:
    def __init__(self, subscription_id: str, slots: AdjustableSlots, breaker: CircuitBreaker,
                 *, rate: RateSlots | None = None) -> None:
        """`breaker`: the subscription's circuit in this process (one, whichever part pushes).
        `rate`: this process's share of the subscription's max_rate_per_s, if it has one."""
        self.subscription_id = subscription_id
        self._slots = slots
        self._rate = rate
        self._breaker = breaker
        self._gauge = IN_FLIGHT.labels(subscription_id)
        self._slot_wait = SLOT_WAIT.labels(subscription_id)

    async def acquire(self, closing: asyncio.Event) -> bool:
        """Waits for the circuit breaker and a slot; False (and no slot) when `closing` is set
        first. Every True must be followed by one `release()`."""
        started = time.perf_counter()
        if self._breaker.is_open:  # the wait may be long: let the caller's close end it
            admitted = asyncio.ensure_future(self._breaker.admit())
            closed = asyncio.ensure_future(closing.wait())
            await asyncio.wait((admitted, closed), return_when=asyncio.FIRST_COMPLETED)
            admitted.cancel()
            closed.cancel()
        if closing.is_set():
            return False
        await self._slots.acquire()
        if self._rate is not None:  # last: the push must begin right after it counts
            try:
                await self._rate.acquire()
            except BaseException:  # cancelled (a close): the slot goes back
                self._slots.release()
                raise
        self._slot_wait.observe(time.perf_counter() - started)
        self._gauge.inc()
        return True

    def release(self, result: AttemptResult | None) -> None:
        """The slot's push is answered (`result`), or it never happened (None)."""
        if result is None:
            self._breaker.forgo()
        else:
            self._breaker.record(result)
        self._slots.release()
        self._gauge.dec()
