"""`Sweeper`: finds deliveries left pending too long and hands them to the retry loops; and the
per-subscription retry gauges (due, waiting, parked, oldest retry age).

Every query is one subscription's range of an index — (subscription, status, created_at) or
(subscription, status, next_attempt_at) — so a sweep costs what is due, not what is stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta

from msgbus.metrics import (
    OLDEST_RETRY_AGE,
    PARKED,
    RETRIES_DUE,
    RETRIES_WAITING,
    SWEEP_SECONDS,
    SWEPT,
)
from msgbus.models import Subscription, utcnow
from msgbus.settings import CompensatorSettings
from msgbus.store.claims import DeliveryClaims

log = logging.getLogger(__name__)

SWEEP_BATCH = 5000
STATS_CAP = 1_000_000


class Sweeper:
    def __init__(self, claims: DeliveryClaims, subscriptions: Callable[[], list[Subscription]],
                 settings: CompensatorSettings) -> None:
        self._claims = claims
        self._subscriptions = subscriptions
        self._settings = settings
        self._tasks: list[asyncio.Task[None]] = []
        self.last_sweep_s: float | None = None
        self.swept = 0

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._every(self._settings.sweep_interval_s, self.sweep),
                                name="sweep"),
            asyncio.create_task(self._every(self._settings.stats_interval_s,
                                            self.update_stats), name="retry-stats"),
        ]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    @staticmethod
    async def _every(interval_s: float, job: Callable[[], Awaitable[object]]) -> None:
        while True:
            try:
                await job()
            except Exception as exc:  # MongoDB down: try again next time
                log.warning("%s failed: %s", getattr(job, "__name__", job), exc)
            await asyncio.sleep(interval_s)

    def sweepable(self) -> list[Subscription]:
        """Not paused, and not changed (e.g. resumed) within the sweep threshold: a resumed
        subscription's dispatcher is still working through what waited in the broker."""
        cutoff = utcnow() - timedelta(seconds=self._settings.sweep_after_s)
        return [s for s in self._subscriptions() if not s.paused and s.updated_at < cutoff]

    async def sweep(self) -> int:
        """One pass over every sweepable subscription; returns how many deliveries it swept."""
        began = time.perf_counter()
        older_than = utcnow() - timedelta(seconds=self._settings.sweep_after_s)
        total = 0
        for sub in self.sweepable():
            while True:
                swept = await self._claims.sweep_pending(sub.id, older_than, SWEEP_BATCH)
                if swept:
                    SWEPT.labels(sub.id).inc(swept)
                    log.warning("%s: %d deliveries pending since before %s swept into the "
                                "retries", sub.id, swept, older_than.isoformat())
                total += swept
                if swept < SWEEP_BATCH:
                    break
        self.last_sweep_s = time.perf_counter() - began
        self.swept += total
        SWEEP_SECONDS.observe(self.last_sweep_s)
        return total

    async def update_stats(self) -> None:
        now = utcnow()
        for sub in self._subscriptions():
            stats = await self._claims.stats(sub.id, STATS_CAP)
            RETRIES_DUE.labels(sub.id).set(stats.due)
            RETRIES_WAITING.labels(sub.id).set(stats.waiting)
            PARKED.labels(sub.id).set(stats.parked)
            age = (now - stats.oldest_failed_at).total_seconds() if stats.oldest_failed_at else 0
            OLDEST_RETRY_AGE.labels(sub.id).set(max(0.0, age))
