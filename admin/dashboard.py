"""What the dashboard shows, from the bus's own records: messages per destination per hour over
the last day, and per subscription its backlog, oldest undelivered age, dead letters and its
last hour's push success rate and latency (p50/p99), the failing ones first. Each figure is an
index-backed query with a cap; the result is cached for a few seconds so a dashboard left open
does not load MongoDB, and rebuilt in the background when stale. Through a MongoDB outage the
dashboard shows the figures last built (`current`)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from pymongo.errors import PyMongoError

from admin.outage import wait_while_mongo_answers
from msgbus.errors import MongoUnavailable
from msgbus.models import DeliveryStatus, utcnow
from msgbus.percentiles import nearest_rank
from msgbus.store import MongoStore
from msgbus.tasks import detached_task

HOURS = 24
COUNT_CAP = 100_000
PUSH_SAMPLE_CAP = 5_000  # the newest attempts of the last hour that the push figures are read from
CACHE_S = 10.0
FIRST_BUILD_CHECK_S = 1.0  # then MongoDB is pinged: a dashboard answers within 3 s of an outage


@dataclass(slots=True)
class PushHealth:
    """A subscription's pushes of the last hour (at most PUSH_SAMPLE_CAP of the newest)."""

    attempts: int = 0
    succeeded: int = 0
    p50_ms: float | None = None
    p99_ms: float | None = None

    @property
    def success_rate(self) -> float | None:
        return self.succeeded / self.attempts if self.attempts else None

    @classmethod
    def of(cls, samples: list[tuple[bool, float]]) -> PushHealth:
        if not samples:
            return cls()
        latencies = sorted(latency for _, latency in samples)
        return cls(attempts=len(samples), succeeded=sum(ok for ok, _ in samples),
                   p50_ms=nearest_rank(latencies, 0.50), p99_ms=nearest_rank(latencies, 0.99))


@dataclass(slots=True)
class SubscriptionHealth:
    id: str
    paused: bool
    backlog: int
    oldest_age_s: float
    parked: int
    pushes: PushHealth

    @property
    def trouble(self) -> tuple[int, float, float, int]:
        """Sort key: dead letters first, then the oldest wait, then the lowest success rate,
        then the backlog."""
        rate = self.pushes.success_rate
        return (-self.parked, -self.oldest_age_s, 1.0 if rate is None else rate, -self.backlog)


@dataclass(slots=True)
class Dashboard:
    hours: list[datetime]  # the start of each hour shown, oldest first
    volume: dict[str, list[int]]  # destination -> messages per hour
    subscriptions: list[SubscriptionHealth]
    made_at: float
    built_at: datetime = field(default_factory=utcnow)

    @property
    def top_destinations(self) -> list[tuple[str, int]]:
        totals = [(code, sum(counts)) for code, counts in self.volume.items()]
        return sorted(totals, key=lambda item: -item[1])[:10]

    @property
    def peak(self) -> int:
        return max((max(c) for c in self.volume.values() if c), default=0)

    @property
    def slowest_p99_ms(self) -> float:
        return max((h.pushes.p99_ms or 0.0 for h in self.subscriptions), default=0.0)


class DashboardData:
    """The figures, built once at a time: a request waits only for the first build; later
    ones get the last figures while a stale set is rebuilt in the background (a build reads a
    count per subscription: seconds on a large store, too long to wait for on every view)."""

    def __init__(self, store: MongoStore) -> None:
        self._store = store
        self._cached: Dashboard | None = None
        self._building: asyncio.Task[Dashboard] | None = None

    async def get(self) -> Dashboard:
        if self._cached is None:
            return await asyncio.shield(self._rebuild())
        if time.monotonic() - self._cached.made_at > CACHE_S:
            self._rebuild()
        return self._cached

    async def current(self) -> Dashboard | None:
        """As `get`, but never a wait for a MongoDB that does not answer: while the gate is
        closed, or once a first build finds MongoDB gone, the figures last built (None before
        the first)."""
        if not self._store.gate.available:
            return self._cached
        if self._cached is not None:
            return await self.get()
        build = self._rebuild()
        if not await wait_while_mongo_answers(build, self._store,
                                              check_after_s=FIRST_BUILD_CHECK_S):
            return None
        try:
            return build.result()
        except (PyMongoError, MongoUnavailable):
            return None

    def _rebuild(self) -> asyncio.Task[Dashboard]:
        if self._building is None or self._building.done():
            self._building = detached_task(self._build_and_keep())
        return self._building

    async def _build_and_keep(self) -> Dashboard:
        self._cached = await self._build()
        return self._cached

    async def _build(self) -> Dashboard:
        now = utcnow()
        first = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=HOURS - 1)
        hours = [first + timedelta(hours=i) for i in range(HOURS)]
        volume = {d.code: await self._per_hour(d.code, first)
                  for d in await self._store.config.list_destinations()}
        health = []
        for sub in await self._store.config.list_subscriptions():
            backlog, oldest = await self._store.progress.backlog(sub.id, COUNT_CAP)
            parked = await self._store.progress.count_deliveries(
                sub.id, DeliveryStatus.PARKED, cap=COUNT_CAP)
            age = (now - oldest).total_seconds() if oldest is not None else 0.0
            pushes = await self._pushes(sub.id, now - timedelta(hours=1))
            health.append(SubscriptionHealth(sub.id, sub.paused, backlog, max(0.0, age),
                                             parked, pushes))
        health.sort(key=lambda h: h.trouble)
        return Dashboard(hours, volume, health, time.monotonic())

    async def _pushes(self, sub_id: str, since: datetime) -> PushHealth:
        return PushHealth.of(
            await self._store.figures.recent_pushes(sub_id, since, PUSH_SAMPLE_CAP))

    async def _per_hour(self, destination: str, first: datetime) -> list[int]:
        """Messages of `destination` per hour since `first`."""
        counts = [0] * HOURS
        for hour, n in (await self._store.figures.messages_per_hour(destination, first)).items():
            index = int((hour - first).total_seconds() // 3600)
            if 0 <= index < HOURS:
                counts[index] = n
        return counts
