"""A PySpark Python data source over the bus's MongoDB collections (no JVM connector needed).

    spark.read.format("msgbus_mongo").schema(DELIVERIES_STATS)
         .options(uri=..., database=..., collection="deliveries", time_field="created_at",
                  start="2026-01-01T00:00:00+00:00", end="2026-01-02T00:00:00+00:00",
                  partitions="8").load()

The time range [start, end) of `time_field` is split into `partitions` slices, each read by
its own Spark task (`msgbus.store.analytics`) and returned as Arrow batches. Filters Spark
pushes down (`spark.sql.python.filterPushdown.enabled=true`) become part of each slice's
MongoDB query; the schema's columns become its projection. Use `read_collection` for a fresh
DataFrame per query: a reader keeps the filters of the query it was planned for.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, Filter, InputPartition
from pyspark.sql.types import StructType

from analytics.arrow_batches import to_record_batch
from analytics.pushdown import push
from analytics.schemas import COLLECTIONS, EXTRA_COLUMN, arrow_schema
from msgbus.store.analytics import AnalyticsStore, slice_query

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SOURCE_NAME = "msgbus_mongo"
_SERVER_TIMEOUT_MS = 10_000


@dataclass(frozen=True)
class ReadOptions:
    uri: str
    database: str
    collection: str
    time_field: str
    start: datetime
    end: datetime
    partitions: int
    batch_rows: int

    @classmethod
    def parse(cls, options: Any) -> ReadOptions:
        def required(name: str) -> str:
            if name not in options:
                raise ValueError(f"{SOURCE_NAME}: option {name!r} is required")
            return str(options[name])

        collection = required("collection")
        default_time_field = COLLECTIONS.get(collection, ("created_at",))[0]
        start, end = parse_time(required("start")), parse_time(required("end"))
        if end <= start:
            raise ValueError(f"{SOURCE_NAME}: end {end} must be after start {start}")
        return cls(uri=required("uri"), database=required("database"), collection=collection,
                   time_field=str(options.get("time_field", default_time_field)),
                   start=start, end=end, partitions=max(1, int(options.get("partitions", 4))),
                   batch_rows=max(100, int(options.get("batch_rows", 10_000))))


def parse_time(text: str) -> datetime:
    value = datetime.fromisoformat(text)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class TimeSlice(InputPartition):
    def __init__(self, start: datetime, end: datetime) -> None:
        super().__init__((start, end))
        self.start = start
        self.end = end


def time_slices(start: datetime, end: datetime, count: int) -> list[TimeSlice]:
    """[start, end) cut into `count` equal slices (fewer when the range has too few
    microseconds), contiguous and without overlap."""
    span_us = int((end - start).total_seconds() * 1_000_000)
    count = max(1, min(count, span_us))
    bounds = [start + (end - start) * i / count for i in range(count)] + [end]
    return [TimeSlice(bounds[i], bounds[i + 1]) for i in range(count)]


class MongoDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        collection = self.options.get("collection", "")
        if collection not in COLLECTIONS:
            raise ValueError(f"{SOURCE_NAME}: give a schema for collection {collection!r}")
        return COLLECTIONS[collection][1]

    def reader(self, schema: StructType) -> DataSourceReader:
        return MongoReader(ReadOptions.parse(self.options), schema)


class MongoReader(DataSourceReader):
    def __init__(self, options: ReadOptions, schema: StructType) -> None:
        self.read_options = options
        self.schema = schema
        self.clauses: list[dict[str, Any]] = []

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        pushed = push(list(filters), {f.name for f in self.schema.fields} - {EXTRA_COLUMN})
        # replaced, never appended to: clauses of another query must not leak into this one
        self.clauses = pushed.clauses
        return iter(pushed.remaining)

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.read_options
        return time_slices(opts.start, opts.end, opts.partitions)

    def query(self, start: datetime, end: datetime) -> dict[str, Any]:
        """The slice's MongoDB query (`msgbus.store.analytics.slice_query`)."""
        return slice_query(self.read_options.time_field, start, end, self.clauses)

    def projection(self) -> dict[str, int] | None:
        names = [f.name for f in self.schema.fields]
        if EXTRA_COLUMN in names:
            return None  # every field: the ones without a column go to EXTRA_COLUMN
        return {name: 1 for name in names} | ({} if "_id" in names else {"_id": 0})

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, TimeSlice)
        opts = self.read_options
        schema = arrow_schema(self.schema)
        with AnalyticsStore(opts.uri, opts.database, tz_aware=False,
                            serverSelectionTimeoutMS=_SERVER_TIMEOUT_MS,
                            appname="msgbus-analytics") as store:
            found = store.read_slice(opts.collection, self.query(partition.start, partition.end),
                                     self.projection(), opts.batch_rows)
            documents: list[dict[str, Any]] = []
            for document in found:
                documents.append(document)
                if len(documents) >= opts.batch_rows:
                    yield to_record_batch(documents, schema, EXTRA_COLUMN)
                    documents = []
            if documents:
                yield to_record_batch(documents, schema, EXTRA_COLUMN)


@dataclass(frozen=True)
class MongoLocation:
    uri: str
    database: str
    partitions: int = 4
    batch_rows: int = 10_000


def register(spark: SparkSession) -> None:
    spark.dataSource.register(MongoDataSource)


def read_collection(spark: SparkSession, location: MongoLocation, collection: str,
                    start: datetime, end: datetime, schema: StructType | None = None,
                    time_field: str | None = None) -> DataFrame:
    """A new DataFrame over `collection` in [start, end): build one per query (see the module
    docstring); `schema` defaults to the collection's full schema.

    Spark plans every query of one DataFrame with the same reader, and calls `pushFilters` only
    when the query has filters: a count without filters after a filtered one ran with the
    previous query's filters (seen here: 12 rows instead of 1800). The always-true filter on
    the time field (the range excludes nulls already) makes every query push its filters, so
    each replaces the previous query's. A fresh DataFrame per query is still the rule."""
    from pyspark.sql import functions as F

    field = time_field or COLLECTIONS[collection][0]
    frame = (spark.read.format(SOURCE_NAME).schema(schema or COLLECTIONS[collection][1])
             .option("uri", location.uri).option("database", location.database)
             .option("collection", collection).option("time_field", field)
             .option("start", start.astimezone(UTC).isoformat())
             .option("end", end.astimezone(UTC).isoformat())
             .option("partitions", str(location.partitions))
             .option("batch_rows", str(location.batch_rows)).load())
    return frame.where(F.col(field).isNotNull())
