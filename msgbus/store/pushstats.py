"""Per-subscription push figures over time, for the admin's subscription page: per minute and per
hour, the pushes by outcome, a latency histogram, the newest failures, and the backlog and the
oldest undelivered age as the dispatchers' backlog monitors sample them.

Written by whoever records outcomes (dispatchers, compensators, replays): the pushes are folded
in memory (`PushStatsBuffer`) and written every 2 s as one `$inc` upsert per subscription and
bucket. Reading a week is 168 hour documents, not a scan of the attempts. A TTL index on
`expires_at` removes old buckets (on MongoDB; SecantusDB never deletes by TTL,
docs/decisions.md).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from pymongo import ASCENDING, IndexModel, UpdateOne

from msgbus.models import AttemptResult
from msgbus.store.gate import MongoGate

# Upper bounds (ms) of the latency histogram's buckets; the last one is open.
LATENCY_BOUNDS_MS: tuple[float, ...] = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000,
                                        30000)
FAILURES_KEPT = 5  # the newest failed pushes kept per subscription and minute
FAILURE_ANSWER_CHARS = 1024
FLUSH_EVERY_S = 2.0  # how long pushes wait in memory before they are added to their buckets
UNITS: dict[str, timedelta] = {"minute": timedelta(minutes=1), "hour": timedelta(hours=1)}
KEEP: dict[str, timedelta] = {"minute": timedelta(days=2), "hour": timedelta(days=35)}

INDEXES = [
    IndexModel([("subscription", ASCENDING), ("unit", ASCENDING), ("at", ASCENDING)]),
    IndexModel([("expires_at", ASCENDING)], expireAfterSeconds=0),
]


def bucket_start(at: datetime, unit: str) -> datetime:
    if unit == "hour":
        return at.replace(minute=0, second=0, microsecond=0)
    return at.replace(second=0, microsecond=0)


def latency_bucket(latency_ms: float) -> int:
    """The index of the histogram bucket `latency_ms` falls in."""
    return bisect.bisect_left(LATENCY_BOUNDS_MS, latency_ms)


def bucket_id(subscription: str, unit: str, at: datetime) -> str:
    return f"{subscription}|{unit}|{at.isoformat()}"


@dataclass(slots=True)
class _Fold:
    """What pushes not yet written add to one bucket."""

    incs: dict[str, int] = field(default_factory=dict)
    failures: list[dict[str, Any]] = field(default_factory=list)

    def add(self, result: AttemptResult) -> None:
        outcome = "ok" if result.ok else ("failed" if result.status_code is not None else "error")
        for key in (outcome, f"h.{latency_bucket(result.latency_ms)}"):
            self.incs[key] = self.incs.get(key, 0) + 1
        if not result.ok:
            self.failures.append(_failure(result))
            if len(self.failures) > 4 * FAILURES_KEPT:  # a burst of failures: keep the newest
                self.failures = self.newest_failures()

    def newest_failures(self) -> list[dict[str, Any]]:
        return sorted(self.failures, key=lambda f: f["at"])[-FAILURES_KEPT:]


def _failure(result: AttemptResult) -> dict[str, Any]:
    return {"at": result.started_at, "message_id": result.message_id,
            "status_code": result.status_code, "error": result.error,
            "answer": (result.answer or "")[:FAILURE_ANSWER_CHARS] or None,
            "latency_ms": round(result.latency_ms, 1)}


Folds = dict[tuple[str, str, datetime], _Fold]  # (subscription, unit, bucket start) -> fold


def fold(folds: Folds, results: Iterable[AttemptResult]) -> None:
    for result in results:
        for unit in UNITS:
            key = (result.subscription, unit, bucket_start(result.started_at, unit))
            folds.setdefault(key, _Fold()).add(result)


def writes_of(folds: Folds) -> list[UpdateOne]:
    """One upsert per subscription and bucket."""
    writes = []
    for (subscription, unit, at), folded in folds.items():
        update: dict[str, Any] = {"$inc": folded.incs,
                                  "$setOnInsert": _identity(subscription, unit, at)}
        if unit == "minute" and folded.failures:
            newest = folded.newest_failures()
            update["$push"] = {"failures": {"$each": newest, "$slice": -FAILURES_KEPT}}
            update["$max"] = {"last_failure_at": newest[-1]["at"]}
        writes.append(UpdateOne({"_id": bucket_id(subscription, unit, at)}, update, upsert=True))
    return writes


def fold_writes(results: Iterable[AttemptResult]) -> list[UpdateOne]:
    """The upserts that add a batch of pushes to their minutes and hours."""
    folds: Folds = {}
    fold(folds, results)
    return writes_of(folds)


class PushStatsBuffer:
    """Pushes folded in memory and written every `every_s` by a task of its own: a few upserts
    per subscription and interval however often outcomes are recorded (per trace flush, they
    cost SecantusDB a round trip each and slowed every flush). A process killed loses at most
    the last interval's figures, never a message or its trace. While MongoDB's gate is closed
    the figures go on folding, and are written once it opens."""

    def __init__(self, write: Callable[[list[UpdateOne]], Awaitable[None]], gate: MongoGate,
                 *, every_s: float = FLUSH_EVERY_S) -> None:
        self._write = write
        self._gate = gate
        self._every_s = every_s
        self._folds: Folds = {}
        self._task: asyncio.Task[None] | None = None

    def add(self, results: Iterable[AttemptResult]) -> None:
        fold(self._folds, results)
        if self._folds and (self._task is None or self._task.done()):
            self._task = asyncio.create_task(self._flush_later())

    async def _flush_later(self) -> None:
        await asyncio.sleep(self._every_s)
        await self._gate.wait_available()
        await self.flush()

    async def flush(self) -> None:
        folds, self._folds = self._folds, {}
        if folds:
            await self._write(writes_of(folds))

    async def close(self, timeout_s: float = 1.0) -> None:
        """Writes what is folded, unless MongoDB does not answer within `timeout_s`: a stop
        must not wait on figures."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.flush(), timeout_s)


def backlog_writes(subscription: str, at: datetime, backlog: int,
                   oldest_age_s: float) -> list[UpdateOne]:
    """A sample of the backlog: the minute keeps the latest, the hour its highest."""
    minute, hour = bucket_start(at, "minute"), bucket_start(at, "hour")
    sample = {"backlog": backlog, "oldest_age_s": round(oldest_age_s, 1)}
    return [
        UpdateOne({"_id": bucket_id(subscription, "minute", minute)},
                  {"$set": sample, "$setOnInsert": _identity(subscription, "minute", minute)},
                  upsert=True),
        UpdateOne({"_id": bucket_id(subscription, "hour", hour)},
                  {"$max": sample, "$setOnInsert": _identity(subscription, "hour", hour)},
                  upsert=True),
    ]


def _identity(subscription: str, unit: str, at: datetime) -> dict[str, Any]:
    return {"subscription": subscription, "unit": unit, "at": at,
            "expires_at": at + UNITS[unit] + KEEP[unit]}


@dataclass(slots=True)
class Bucket:
    """One minute or hour of a subscription's pushes, as read back."""

    at: datetime
    ok: int = 0
    failed: int = 0  # answered with a status other than 2xx
    error: int = 0  # no answer: timeout, refused, reset
    histogram: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BOUNDS_MS) + 1))
    backlog: int | None = None
    oldest_age_s: float | None = None

    @property
    def pushes(self) -> int:
        return self.ok + self.failed + self.error

    def percentile_ms(self, q: float) -> float | None:
        """The upper bound of the bucket holding the q-quantile (the last bucket: its lower
        bound); None with no pushes."""
        total = sum(self.histogram)
        if not total:
            return None
        rank, seen = q * total, 0
        for index, count in enumerate(self.histogram):
            seen += count
            if seen >= rank and count:
                return LATENCY_BOUNDS_MS[min(index, len(LATENCY_BOUNDS_MS) - 1)]
        return LATENCY_BOUNDS_MS[-1]

    @classmethod
    def of(cls, doc: dict[str, Any]) -> Bucket:
        bucket = cls(at=doc["at"], ok=int(doc.get("ok", 0)), failed=int(doc.get("failed", 0)),
                     error=int(doc.get("error", 0)), backlog=doc.get("backlog"),
                     oldest_age_s=doc.get("oldest_age_s"))
        for index, count in (doc.get("h") or {}).items():
            if str(index).isdigit() and int(index) < len(bucket.histogram):
                bucket.histogram[int(index)] = int(count)
        return bucket


def series(docs: Sequence[dict[str, Any]], first: datetime, unit: str, points: int
           ) -> list[Bucket]:
    """`points` buckets from `first` on, one per unit, empty where nothing was recorded."""
    step = UNITS[unit]
    by_start = {doc["at"]: Bucket.of(doc) for doc in docs}
    return [by_start.get(first + i * step) or Bucket(at=first + i * step) for i in range(points)]
