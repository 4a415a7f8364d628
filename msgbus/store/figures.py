"""`FigureStore`: the figures people read about the pushes — each subscription's push figures
over time (`push_stats`, `msgbus/store/pushstats.py`: written by whoever records outcomes,
sampled backlogs) and the admin dashboard's reads of the records (messages per hour, the last
hour's pushes)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from pymongo import ASCENDING, DESCENDING, UpdateOne
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError, PyMongoError

from msgbus.errors import MongoUnavailable
from msgbus.models import AttemptResult, utcnow
from msgbus.store import pushstats
from msgbus.store.duplicates import DUPLICATE_KEY
from msgbus.store.gate import MongoGate

log = logging.getLogger(__name__)

PUSH_FIGURES_TIMEOUT_S = 5.0


class FigureStore:
    def __init__(self, db: AsyncDatabase[dict[str, Any]], gate: MongoGate) -> None:
        self._push_stats = db["push_stats"]
        self._attempts = db["attempts"]
        self._messages = db["messages"]
        self._gate = gate
        self._pushes = pushstats.PushStatsBuffer(self._upsert_push_stats, gate)

    def add_pushes(self, results: Iterable[AttemptResult]) -> None:
        """Adds pushes to their subscriptions' figures (written within 2 s)."""
        self._pushes.add(results)

    async def close(self) -> None:
        await self._pushes.close()

    async def record_backlog_samples(self, samples: list[tuple[str, int, float]]) -> None:
        """Samples of (subscription, backlog, oldest undelivered age in s), in one write."""
        now = utcnow()
        await self._upsert_push_stats([write for sub, backlog, age in samples
                                       for write in pushstats.backlog_writes(sub, now, backlog,
                                                                             age)])

    async def _upsert_push_stats(self, writes: list[UpdateOne]) -> None:
        """Best effort: the figures are for people, the trace is the record. Two processes
        upserting a new bucket at once: one loses with a duplicate key and writes again."""
        for _ in range(2):
            if not writes:
                return
            try:
                async with self._gate.guard("push figures", PUSH_FIGURES_TIMEOUT_S):
                    await self._push_stats.bulk_write(writes, ordered=False)
                return
            except BulkWriteError as exc:
                errors = exc.details.get("writeErrors", [])
                if any(e.get("code") != DUPLICATE_KEY for e in errors):
                    log.warning("push figures not recorded: %s", errors[:1])
                    return
                writes = [writes[e["index"]] for e in errors]
            except (MongoUnavailable, PyMongoError) as exc:
                log.warning("push figures not recorded: %s", exc)
                return

    async def push_stats_since(self, subscription: str, unit: str,
                               since: datetime) -> list[dict[str, Any]]:
        cursor = self._push_stats.find(
            {"subscription": subscription, "unit": unit, "at": {"$gte": since}},
            {"failures": 0}).sort("at", ASCENDING)
        return [doc async for doc in cursor]

    async def latest_push_failures(self, subscription: str, limit: int) -> list[dict[str, Any]]:
        """The newest failed pushes of a subscription (at most FAILURES_KEPT per minute)."""
        cursor = self._push_stats.find(
            {"subscription": subscription, "unit": "minute", "last_failure_at": {"$exists": True}},
            {"failures": 1}).sort("at", DESCENDING).limit(limit)
        failures = [f async for doc in cursor for f in doc["failures"]]
        return sorted(failures, key=lambda f: f["at"], reverse=True)[:limit]

    # --- the dashboard ---------------------------------------------------------------------

    async def recent_pushes(self, subscription: str, since: datetime,
                            limit: int) -> list[tuple[bool, float]]:
        """(succeeded, latency ms) of the subscription's newest `limit` pushes since `since`:
        one index range of (subscription, started_at), newest first."""
        cursor = self._attempts.find(
            {"subscription": subscription, "started_at": {"$gte": since}},
            {"_id": 0, "ok": 1, "latency_ms": 1},
        ).sort("started_at", -1).limit(limit)
        return [(bool(doc.get("ok")), float(doc.get("latency_ms") or 0.0))
                async for doc in cursor]

    async def messages_per_hour(self, destination: str, since: datetime) -> dict[datetime, int]:
        """Messages of `destination` by the hour they were created in, since `since`: one
        aggregation over the (destination, created_at) index range."""
        pipeline: list[dict[str, Any]] = [
            {"$match": {"destination": destination, "created_at": {"$gte": since}}},
            {"$group": {"_id": {"$dateTrunc": {"date": "$created_at", "unit": "hour"}},
                        "n": {"$sum": 1}}},
        ]
        return {row["_id"]: int(row["n"])
                async for row in await self._messages.aggregate(pipeline)}
