"""What the dashboard shows, from the bus's own records: messages per destination per hour over
the last day, and per subscription its backlog, oldest undelivered age and dead letters, the
failing ones first. Each figure is an index-backed query with a cap; the result is cached for a
few seconds so a dashboard left open does not load MongoDB."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from msgbus.models import DeliveryStatus, utcnow
from msgbus.store import MongoStore

HOURS = 24
COUNT_CAP = 100_000
CACHE_S = 10.0


@dataclass(slots=True)
class SubscriptionHealth:
    id: str
    paused: bool
    backlog: int
    oldest_age_s: float
    parked: int

    @property
    def trouble(self) -> tuple[int, float, int]:
        """Sort key: dead letters first, then the oldest wait, then the backlog."""
        return (-self.parked, -self.oldest_age_s, -self.backlog)


@dataclass(slots=True)
class Dashboard:
    hours: list[datetime]  # the start of each hour shown, oldest first
    volume: dict[str, list[int]]  # destination -> messages per hour
    subscriptions: list[SubscriptionHealth]
    made_at: float

    @property
    def top_destinations(self) -> list[tuple[str, int]]:
        totals = [(code, sum(counts)) for code, counts in self.volume.items()]
        return sorted(totals, key=lambda item: -item[1])[:10]

    @property
    def peak(self) -> int:
        return max((max(c) for c in self.volume.values() if c), default=0)


class DashboardData:
    def __init__(self, store: MongoStore) -> None:
        self._store = store
        self._cached: Dashboard | None = None

    async def get(self) -> Dashboard:
        if self._cached is None or time.monotonic() - self._cached.made_at > CACHE_S:
            self._cached = await self._build()
        return self._cached

    async def _build(self) -> Dashboard:
        now = utcnow()
        first = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=HOURS - 1)
        hours = [first + timedelta(hours=i) for i in range(HOURS)]
        volume = {d.code: await self._per_hour(d.code, first)
                  for d in await self._store.list_destinations()}
        health = []
        for sub in await self._store.list_subscriptions():
            backlog, oldest = await self._store.backlog(sub.id, COUNT_CAP)
            parked = await self._store.deliveries.count_documents(
                {"subscription": sub.id, "status": DeliveryStatus.PARKED.value},
                limit=COUNT_CAP)
            age = (now - oldest).total_seconds() if oldest is not None else 0.0
            health.append(SubscriptionHealth(sub.id, sub.paused, backlog, max(0.0, age),
                                             parked))
        health.sort(key=lambda h: h.trouble)
        return Dashboard(hours, volume, health, time.monotonic())

    async def _per_hour(self, destination: str, first: datetime) -> list[int]:
        """Messages of `destination` per hour since `first`: one aggregation over the
        (destination, created_at) index range."""
        pipeline: list[dict[str, Any]] = [
            {"$match": {"destination": destination, "created_at": {"$gte": first}}},
            {"$group": {"_id": {"$dateTrunc": {"date": "$created_at", "unit": "hour"}},
                        "n": {"$sum": 1}}},
        ]
        counts = [0] * HOURS
        async for row in await self._store.messages.aggregate(pipeline):
            index = int((row["_id"] - first).total_seconds() // 3600)
            if 0 <= index < HOURS:
                counts[index] = int(row["n"])
        return counts
