"""A subscription's figures over time: what a batch of pushes adds to its minute and hour
buckets, and what the subscription page reads back from them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from msgbus_devtools.testkit.waiting import eventually_async

from admin.subscription_health import charts
from msgbus.models import AttemptResult
from msgbus.store.gate import MongoGate
from msgbus.store.pushstats import (
    FAILURES_KEPT,
    Bucket,
    PushStatsBuffer,
    backlog_writes,
    bucket_id,
    fold_writes,
    latency_bucket,
    series,
)

AT = datetime(2026, 11, 27, 10, 41, 30, tzinfo=UTC)


def _push(n: int, status: int | None, latency_ms: float = 20.0, **more: object) -> AttemptResult:
    return AttemptResult(message_id=f"m{n}", subscription="orders/billing", attempt=1,
                         started_at=AT + timedelta(milliseconds=n), latency_ms=latency_ms,
                         status_code=status, **more)  # type: ignore[arg-type]


def test_a_batch_of_pushes_is_one_upsert_per_bucket_counting_each_outcome() -> None:
    pushes = [_push(1, 200), _push(2, 204, 700.0), _push(3, 503, answer="db down"),
              _push(4, None, 5000.0, error="timeout")]
    writes = {w._filter["_id"]: w._doc for w in fold_writes(pushes)}
    minute = writes[bucket_id("orders/billing", "minute", AT.replace(second=0))]
    hour = writes[bucket_id("orders/billing", "hour", AT.replace(minute=0, second=0))]
    assert len(writes) == 2
    for update in (minute, hour):
        incs = update["$inc"]
        assert (incs["ok"], incs["failed"], incs["error"]) == (2, 1, 1)
        assert sum(v for k, v in incs.items() if k.startswith("h.")) == 4
    failures = minute["$push"]["failures"]["$each"]
    assert [(f["message_id"], f["status_code"], f["error"], f["answer"]) for f in failures] == [
        ("m3", 503, None, "db down"), ("m4", None, "timeout", None)]
    assert "$push" not in hour  # failures are kept per minute only


def test_only_the_newest_failures_of_a_minute_are_kept() -> None:
    writes = fold_writes([_push(n, 500) for n in range(FAILURES_KEPT + 3)])
    minute = next(w._doc for w in writes if "|minute|" in w._filter["_id"])
    kept = minute["$push"]["failures"]
    assert kept["$slice"] == -FAILURES_KEPT
    assert [f["message_id"] for f in kept["$each"]] == [
        f"m{n}" for n in range(3, FAILURES_KEPT + 3)]


def test_the_hour_keeps_the_highest_backlog_sample_the_minute_the_latest() -> None:
    minute, hour = backlog_writes("orders/billing", AT, 120, 35.04)
    assert minute._doc["$set"] == {"backlog": 120, "oldest_age_s": 35.0}
    assert hour._doc["$max"] == {"backlog": 120, "oldest_age_s": 35.0}


def test_percentiles_come_from_the_histogram_buckets() -> None:
    bucket = Bucket(at=AT)
    for latency, count in ((3.0, 98), (40.0, 1), (900.0, 1)):
        bucket.histogram[latency_bucket(latency)] += count
    assert bucket.percentile_ms(0.50) == 5
    assert bucket.percentile_ms(0.99) == 50
    assert bucket.percentile_ms(1.0) == 1000
    assert Bucket(at=AT).percentile_ms(0.5) is None


def test_a_series_has_every_bucket_of_the_range_empty_where_nothing_happened() -> None:
    first = AT.replace(second=0) - timedelta(minutes=59)
    docs = [{"at": AT.replace(second=0), "ok": 3, "h": {"2": 3}, "backlog": 7}]
    buckets = series(docs, first, "minute", 60)
    assert len(buckets) == 60 and buckets[0].at == first
    assert [(b.ok, b.backlog) for b in buckets if b.pushes] == [(3, 7)]
    outcome, latency, backlog, age = charts(buckets, "minute")
    assert [bar.label for bar in outcome.bars] == ["10:41 UTC: 3 ok"]
    assert outcome.bars[0].height > 70  # the peak fills the chart
    assert len(latency.lines["p50"]) == 1  # one point: the one minute with pushes
    assert [bar.label for bar in backlog.bars] == ["10:41 UTC: 7 messages"]
    assert age.bars == [] and age.peak == 0


async def _answers() -> None:
    """A MongoDB ping that answers (the gate stays open)."""


async def test_the_buffer_writes_what_it_folded_once_per_interval_and_on_close() -> None:
    written: list[list[Any]] = []

    async def write(writes: list[Any]) -> None:
        written.append(writes)

    buffer = PushStatsBuffer(write, MongoGate(_answers, component="test"), every_s=0.05)
    buffer.add([_push(1, 200), _push(2, 500)])
    buffer.add([_push(3, 200)])
    await eventually_async(lambda: len(written) == 1, 15)
    minute = next(w._doc for w in written[0] if "|minute|" in w._filter["_id"])
    assert (minute["$inc"]["ok"], minute["$inc"]["failed"]) == (2, 1)  # one write for both
    buffer.add([_push(4, 200)])
    await buffer.close()  # before its interval: written at once
    assert len(written) == 2
