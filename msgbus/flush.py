"""`Flusher`: moves entries of a durable local queue into a sink (MongoDB, a broker), in batches.

An entry is deleted only after the sink took it, so a crash anywhere re-delivers the batch to
the sink; sinks are idempotent. A failing sink is retried with backoff: the loop never dies. A
failed batch halves the next one (down to one entry), and that size holds for the next
`STEADY_BATCHES` batches; then each batch taken doubles it again, up to `batch_size`. A batch too
big to be taken within the sink's timeout (a loaded server) would otherwise be retried whole, and
fail, forever while the queue grows behind it; growing back at once would fail every other batch,
each failure costing a timeout. A
sink that depends on MongoDB gives its gate's `wait_available` as `ready`: during an outage the
entries wait in the queue without a try per backoff step, and move as soon as the gate opens.

`PartitionedFlusher` flushes each partition of a partitioned queue (e.g. one per destination) in
a task of its own, so that a sink that is slow or failing for one partition (its broker is
down) never holds back the others.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable

from msgbus.backoff import backoff_s
from msgbus.errors import MongoUnavailable
from msgbus.localqueue import LocalQueue
from msgbus.tasks import cancel_and_wait

log = logging.getLogger(__name__)

RETRY_FIRST_S = 0.1  # after a failed batch; then twice as long each time, up to max_backoff_s
STEADY_BATCHES = 32  # taken at a size a failure halved to, before trying bigger ones again

Sink = Callable[[list[bytes]], Awaitable[None]]
Ready = Callable[[], Awaitable[None]]  # returns once the sink can be tried


class Flusher:
    def __init__(
        self, queue: LocalQueue, name: str, sink: Sink, *, batch_size: int,
        idle_wait_s: float = 0.5, max_backoff_s: float = 5.0, ready: Ready | None = None,
    ) -> None:
        self.name = name
        self._queue, self._sink, self._ready = queue, sink, ready
        self._batch_size = batch_size  # the most a batch holds
        self.batch_now = batch_size  # what the next batch may hold: see the module's doc
        self._taken_since_failure = STEADY_BATCHES
        self._idle_wait_s, self._max_backoff_s = idle_wait_s, max_backoff_s
        self._task: asyncio.Task[None] | None = None
        self.failures = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"flush-{self.name}")

    async def close(self) -> None:
        await cancel_and_wait(self._task)

    async def flush_once(self) -> int:
        """Move one batch; returns how many entries moved."""
        return await self._move_batch()

    async def _move_batch(self, partition: str | None = None) -> int:
        entries = self._queue.read(self.name, self.batch_now, partition=partition)
        if not entries:
            return 0
        await self._sink([value for _, value in entries])
        await self._queue.delete(self.name, [key for key, _ in entries])
        return len(entries)

    def _batch_taken(self) -> None:
        self._taken_since_failure += 1
        if self._taken_since_failure >= STEADY_BATCHES:
            self.batch_now = min(self._batch_size, self.batch_now * 2)

    def _batch_failed(self) -> None:
        self._taken_since_failure = 0
        self.batch_now = max(1, self.batch_now // 2)

    async def _until_moved(self, move: Callable[[], Awaitable[int]], what: str) -> int:
        """`move()`'s result once it succeeds; each failure waits longer (the loop never
        dies: the sink is idempotent and nothing is deleted before it took it)."""
        failures = 0
        while True:
            try:
                if self._ready is not None:
                    await self._ready()
                moved = await move()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.failures += 1
                self._batch_failed()
                if self._ready is not None and isinstance(exc, MongoUnavailable):
                    log.warning("flushing %s waits for MongoDB (%s); next batch at most %d",
                                what, exc, self.batch_now)
                    continue  # `ready` waits until the gate opens
                failures += 1
                delay = backoff_s(failures=failures, first_s=RETRY_FIRST_S,
                                  max_s=self._max_backoff_s)
                log.warning("flushing %s failed (%s); retrying in %.1fs, at most %d entries",
                            what, exc, delay, self.batch_now)
                await asyncio.sleep(delay)
            else:
                if moved:
                    self._batch_taken()
                return moved

    async def _run(self) -> None:
        while True:
            moved = await self._until_moved(self.flush_once, self.name)
            if moved < self.batch_now:
                await self._idle()

    async def _idle(self) -> None:
        """Called after a batch that was not full: wait for more entries."""
        await self._queue.wait_for_entries(self.name, self._idle_wait_s)


class PartitionedFlusher(Flusher):
    """A `Flusher` of a partitioned queue: every partition that holds entries gets a task of
    its own, which moves batches of that partition only (so each batch the sink gets belongs
    to one partition) and ends when the partition is empty. One partition's failing sink is
    retried with its own backoff while the other partitions keep moving."""

    def __init__(
        self, queue: LocalQueue, name: str, sink: Sink, *, batch_size: int,
        idle_wait_s: float = 0.5, max_backoff_s: float = 5.0, ready: Ready | None = None,
    ) -> None:
        super().__init__(queue, name, sink, batch_size=batch_size, idle_wait_s=idle_wait_s,
                         max_backoff_s=max_backoff_s, ready=ready)
        self._partition_tasks: dict[str, asyncio.Task[None]] = {}

    async def flush_once(self) -> int:
        """Move one batch of every partition, one after the other; returns how many moved."""
        moved = 0
        for partition in self._queue.partitions(self.name):
            moved += await self._move_batch(partition)
        return moved

    def busy_partitions(self) -> list[str]:
        """Partitions being flushed right now."""
        return sorted(p for p, task in self._partition_tasks.items() if not task.done())

    async def _run(self) -> None:
        try:
            while True:
                for partition in self._queue.partitions(self.name):
                    task = self._partition_tasks.get(partition)
                    if task is None or task.done():
                        self._partition_tasks[partition] = asyncio.create_task(
                            self._flush_partition(partition),
                            name=f"flush-{self.name}-{partition}")
                await self._idle()
        finally:
            tasks = list(self._partition_tasks.values())
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._partition_tasks.clear()

    async def _flush_partition(self, partition: str) -> None:
        move = functools.partial(self._move_batch, partition)
        while await self._until_moved(move, f"{self.name}/{partition}"):
            pass
