"""Pure parts of the analytics jobs: filter pushdown translations, time slices, Arrow batches,
UUIDv7 dates, CLI time parsing. No Spark session, no MongoDB."""

from __future__ import annotations

import itertools
from datetime import UTC, date, datetime, timedelta

import pyarrow as pa
from pyspark.sql.datasource import (
    EqualTo,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    IsNull,
    LessThan,
    Not,
    StringContains,
    StringStartsWith,
)

from analytics.arrow_batches import to_record_batch
from analytics.mongo_source import MongoReader, ReadOptions, time_slices
from analytics.pushdown import push, to_mongo
from analytics.schemas import (
    ARROW_TIMESTAMP,
    DELIVERIES_FULL,
    DELIVERIES_STATS,
    arrow_schema,
)
from analytics.trace import uuid7_date
from msgbus.ids import uuid7
from msgbus_cli.analytics_cmd import parse_time

COLUMNS = {"status", "subscription", "created_at", "attempts"}


def test_analytics_pushdown_translates_exactly_or_not_at_all() -> None:
    naive = datetime(2026, 3, 1, 12, 0)
    assert to_mongo(EqualTo(("status",), "parked"), COLUMNS) == {"status": {"$eq": "parked"}}
    assert to_mongo(In(("status",), ("failed", "parked")), COLUMNS) == {
        "status": {"$in": ["failed", "parked"]}}
    assert to_mongo(GreaterThanOrEqual(("created_at",), naive), COLUMNS) == {
        "created_at": {"$gte": naive.replace(tzinfo=UTC)}}
    # SQL's `<>` drops nulls; MongoDB's $ne would keep them
    assert to_mongo(Not(EqualTo(("status",), "parked")), COLUMNS) == {
        "status": {"$nin": ["parked", None]}}
    assert to_mongo(IsNull(("status",)), COLUMNS) == {"status": None}
    assert to_mongo(StringStartsWith(("subscription",), "a.b/"), COLUMNS) == {
        "subscription": {"$regex": "^a\\.b/"}}
    assert to_mongo(StringContains(("subscription",), "x"), COLUMNS) is None
    assert to_mongo(EqualTo(("headers", "tag"), "x"), COLUMNS) is None  # nested path
    assert to_mongo(EqualTo(("unknown",), 1), COLUMNS) is None


def test_analytics_push_returns_the_filters_spark_must_still_apply() -> None:
    kept = StringContains(("subscription",), "x")
    pushed = push([EqualTo(("status",), "parked"), kept, LessThan(("attempts",), 3)], COLUMNS)
    assert pushed.remaining == [kept]
    assert pushed.clauses == [{"status": {"$eq": "parked"}}, {"attempts": {"$lt": 3}}]


def test_analytics_reader_replaces_its_filters_for_each_query() -> None:
    options = ReadOptions.parse({
        "uri": "mongodb://x", "database": "d", "collection": "deliveries",
        "start": "2026-03-01T00:00:00", "end": "2026-03-02T00:00:00"})
    reader = MongoReader(options, DELIVERIES_STATS)
    assert list(reader.pushFilters([EqualTo(("status",), "parked")])) == []
    assert list(reader.pushFilters([EqualTo(("status",), "failed")])) == []
    start, end = options.start, options.end
    assert reader.query(start, end) == {"created_at": {"$gte": start, "$lt": end},
                                        "status": {"$eq": "failed"}}
    later = datetime(2026, 3, 1, 12, tzinfo=UTC)
    list(reader.pushFilters([IsNotNull(("created_at",)), GreaterThanOrEqual(("created_at",),
                                                                             later)]))
    # merged into the slice's range where the operators differ, else one more condition
    assert reader.query(start, end) == {"$and": [
        {"created_at": {"$gte": start, "$lt": end, "$ne": None}},
        {"created_at": {"$gte": later}}]}
    assert reader.projection() == {name: 1 for name in DELIVERIES_STATS.fieldNames()}
    assert MongoReader(options, DELIVERIES_FULL).projection() is None  # `extra` needs all


def test_analytics_time_slices_cover_the_range_without_overlap() -> None:
    start = datetime(2026, 3, 1, tzinfo=UTC)
    end = start + timedelta(hours=3, microseconds=7)
    slices = time_slices(start, end, 8)
    assert len(slices) == 8
    assert slices[0].start == start and slices[-1].end == end
    assert all(a.end == b.start for a, b in itertools.pairwise(slices))
    assert len(time_slices(start, start + timedelta(microseconds=3), 8)) == 3


def test_analytics_record_batches_have_utc_microsecond_timestamps_and_keep_extra_fields() -> None:
    schema = arrow_schema(DELIVERIES_FULL)
    batch = to_record_batch([
        {"_id": "a", "created_at": datetime(2026, 3, 1, 12, 0, 0, 123456), "attempts": 2.0,
         "last_status_code": 200, "lease_owner": "c1", "status": "delivered"},
        {"_id": "b", "created_at": None, "attempts": None, "last_error": {"code": 5}},
    ], schema, "extra")
    assert batch.schema.field("created_at").type == ARROW_TIMESTAMP == pa.timestamp("us", "UTC")
    assert batch.column("created_at")[0].as_py() == datetime(2026, 3, 1, 12, 0, 0, 123456,
                                                             tzinfo=UTC)
    assert batch.column("attempts").to_pylist() == [2, None]  # a float stored: converted
    assert batch.column("last_error").to_pylist() == [None, '{"code":5}']
    assert batch.column("extra").to_pylist() == ['{"lease_owner":"c1"}', None]


def test_analytics_uuid7_date_and_cli_times() -> None:
    assert uuid7_date(uuid7()) == datetime.now(UTC).date()
    assert uuid7_date("m000000001") is None
    assert uuid7_date("0b3e5f0a-6c1d-4e8f-9a7b-2c4d6e8f0a1b") is None  # a UUIDv4
    assert parse_time("2026-03-01") == datetime(2026, 3, 1, tzinfo=UTC)
    assert parse_time("2026-03-01T02:00:00+02:00") == datetime(2026, 3, 1, tzinfo=UTC)
    assert parse_time("now").date() == date.today()
