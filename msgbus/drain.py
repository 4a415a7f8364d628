"""`Drainer`: moves entries of a durable local queue into a sink (MongoDB, a broker), in batches.

An entry is deleted only after the sink took it, so a crash anywhere re-delivers the batch to
the sink; sinks are idempotent. A failing sink is retried with backoff: the loop never dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from msgbus.localqueue import LocalQueue

log = logging.getLogger(__name__)

Sink = Callable[[list[bytes]], Awaitable[None]]


class Drainer:
    def __init__(
        self, queue: LocalQueue, name: str, sink: Sink, *, batch_size: int,
        idle_wait_s: float = 0.5, max_backoff_s: float = 5.0,
    ) -> None:
        self._queue = queue
        self.name = name
        self._sink = sink
        self._batch_size = batch_size
        self._idle_wait_s = idle_wait_s
        self._max_backoff_s = max_backoff_s
        self._task: asyncio.Task[None] | None = None
        self.failures = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"drain-{self.name}")

    async def close(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def drain_once(self) -> int:
        """Move one batch; returns how many entries moved."""
        entries = self._queue.read(self.name, self._batch_size)
        if not entries:
            return 0
        await self._sink([value for _, value in entries])
        await self._queue.delete(self.name, [key for key, _ in entries])
        return len(entries)

    async def _run(self) -> None:
        backoff = 0.1
        while True:
            try:
                moved = await self.drain_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.failures += 1
                log.warning("draining %s failed (%s); retrying in %.1fs", self.name, exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._max_backoff_s)
                continue
            backoff = 0.1
            if moved < self._batch_size:
                await self._idle()

    async def _idle(self) -> None:
        """Called after a batch that was not full: wait for more entries."""
        await self._queue.wait_for_entries(self.name, self._idle_wait_s)
