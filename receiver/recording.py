"""`RecordWriter`: flushes the receiver's record queue into MongoDB in batches, each destination
at its own rate and all destinations under a global rate; both can change at any moment.

The record queue is partitioned by destination, so a destination held back by its rate never
delays the records of the others.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from msgbus.flush import Flusher, Ready, Sink
from msgbus.localqueue import LocalQueue
from msgbus.ratelimit import TokenBucket

RateOf = Callable[[str], float]  # destination -> records/s, 0: unlimited


class RecordWriter(Flusher):
    def __init__(
        self, queue: LocalQueue, name: str, sink: Sink, *, batch_size: int,
        global_rate: Callable[[], float], rate_of: RateOf, idle_wait_s: float = 0.5,
        ready: Ready | None = None,
    ) -> None:
        super().__init__(queue, name, sink, batch_size=batch_size, idle_wait_s=idle_wait_s,
                         ready=ready)
        self._global_rate = global_rate
        self._rate_of = rate_of
        self._global = TokenBucket()
        self._buckets: dict[str, TokenBucket] = {}
        self._turn = 0  # which destination goes first: rotates for fairness
        self._throttled_for_s = 0.0

    def _bucket(self, destination: str) -> TokenBucket:
        bucket = self._buckets.get(destination)
        if bucket is None:
            bucket = self._buckets[destination] = TokenBucket()
        bucket.set_rate(self._rate_of(destination))
        return bucket

    async def flush_once(self) -> int:
        self._throttled_for_s = 0.0
        destinations = self._queue.partitions(self.name)
        if not destinations:
            return 0
        self._global.set_rate(self._global_rate())
        budget = min(self.batch_now, self._global.available())
        limited_by_global = budget < self.batch_now
        if budget <= 0:
            self._throttled_for_s = self._global.wait_s()
            return 0
        first = self._turn % len(destinations)
        self._turn += 1
        taken: dict[str, list[tuple[bytes, bytes]]] = {}
        waits: list[float] = []
        for destination in destinations[first:] + destinations[:first]:
            if budget <= 0:
                break
            bucket = self._bucket(destination)
            allowed = min(budget, bucket.available())
            if allowed <= 0:
                waits.append(bucket.wait_s())
                continue
            entries = self._queue.read(self.name, allowed, partition=destination)
            taken[destination] = entries
            budget -= len(entries)
        entries = [entry for part in taken.values() for entry in part]
        if entries:
            await self._sink([value for _, value in entries])
            for destination, part in taken.items():
                self._bucket(destination).take(len(part))
            self._global.take(len(entries))
            await self._queue.delete(self.name, [key for key, _ in entries])
        if limited_by_global:
            waits.append(self._global.wait_s())
        # a positive wait, even when a token is due now: entries are known to be waiting
        self._throttled_for_s = max(min(waits), 0.001) if waits else 0.0
        return len(entries)

    async def _idle(self) -> None:
        if self._throttled_for_s > 0:
            # entries are waiting for their rate: come back when a token is due
            await asyncio.sleep(min(self._throttled_for_s, self._idle_wait_s))
        else:
            await super()._idle()
