"""Per-subscription push figures over time, for the admin's subscription page: per minute and per
hour, the pushes by outcome, a latency histogram, the newest failures, and the backlog and the
oldest undelivered age as the compensator samples them.

Written by whoever records outcomes (dispatchers, compensators, replays): each batch of outcomes
is folded into one `$inc` upsert per subscription and bucket, in the same call that appends the
attempts, so the figures are as fresh as the trace. Reading a week is 168 hour documents, not a
scan of the attempts. A TTL index on `expires_at` removes old buckets (on MongoDB; SecantusDB
never deletes by TTL, docs/decisions.md).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from pymongo import ASCENDING, IndexModel, UpdateOne

from msgbus.models import AttemptResult

# Upper bounds (ms) of the latency histogram's buckets; the last one is open.
LATENCY_BOUNDS_MS: tuple[float, ...] = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000,
                                        30000)
FAILURES_KEPT = 5  # the newest failed pushes kept per subscription and minute
FAILURE_ANSWER_CHARS = 1024
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
    """What one batch of outcomes adds to one bucket."""

    incs: dict[str, int] = field(default_factory=dict)
    failures: list[dict[str, Any]] = field(default_factory=list)

    def add(self, result: AttemptResult) -> None:
        outcome = "ok" if result.ok else ("failed" if result.status_code is not None else "error")
        for key in (outcome, f"h.{latency_bucket(result.latency_ms)}"):
            self.incs[key] = self.incs.get(key, 0) + 1
        if not result.ok:
            self.failures.append(_failure(result))


def _failure(result: AttemptResult) -> dict[str, Any]:
    return {"at": result.started_at, "message_id": result.message_id,
            "status_code": result.status_code, "error": result.error,
            "answer": (result.answer or "")[:FAILURE_ANSWER_CHARS] or None,
            "latency_ms": round(result.latency_ms, 1)}


def fold_writes(results: Iterable[AttemptResult]) -> list[UpdateOne]:
    """One upsert per subscription and bucket (a minute and an hour) for a batch of pushes."""
    folds: dict[tuple[str, str, datetime], _Fold] = {}
    for result in results:
        for unit in UNITS:
            key = (result.subscription, unit, bucket_start(result.started_at, unit))
            folds.setdefault(key, _Fold()).add(result)
    writes = []
    for (subscription, unit, at), fold in folds.items():
        update: dict[str, Any] = {"$inc": fold.incs,
                                  "$setOnInsert": _identity(subscription, unit, at)}
        if unit == "minute" and fold.failures:
            newest = sorted(fold.failures, key=lambda f: f["at"])[-FAILURES_KEPT:]
            update["$push"] = {"failures": {"$each": newest, "$slice": -FAILURES_KEPT}}
            update["$max"] = {"last_failure_at": newest[-1]["at"]}
        writes.append(UpdateOne({"_id": bucket_id(subscription, unit, at)}, update, upsert=True))
    return writes


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
