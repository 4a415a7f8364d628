"""`msgbus analytics archive --before T`: messages older than T and their delivery traces to
Parquet, then marked archived so that retention (`analytics.retention`) may remove them.

Layout: <archive_dir>/{messages,deliveries,attempts}/date=YYYY-MM-DD/destination=CODE/*.parquet
(date of the record's own time: created_at, or started_at for an attempt), every field of each
document (`analytics.schemas` *_FULL, the unknown ones as JSON in `extra`).

Order of work, so that a crash anywhere leaves nothing lost and a rerun finishes the job:
1. read the records not yet archived (messages created before T, their deliveries, and their
   attempts of any time) and count them against MongoDB's own count of the same query;
   messages with a delivery still under way (pending — no delivery state yet for one of the
   subscriptions it was recorded for —, failed, retrying) wait for a later run;
2. write the rows the archive does not hold yet (by _id: a rerun after a crash between the
   write and the marking writes nothing twice);
3. read the archive back: every record of this run must be there;
4. only then set `archived_at` (attempts, then deliveries, then messages).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analytics.errors import ArchiveMismatch
from analytics.inputs import DATE_COLUMN, DESTINATION_COLUMN
from analytics.mongo_source import read_collection
from analytics.progress import Progress
from analytics.schemas import ARCHIVED_AT
from analytics.session import mongo_location
from analytics.settings import AnalyticsSettings
from msgbus.models import OPEN_STATUSES
from msgbus.store.analytics import AnalyticsStore

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

TABLES = ("messages", "deliveries", "attempts")
# an attempt is written to MongoDB after it finished: those that started in the last moments
# may still be on their way; they wait for the next run
_ATTEMPT_SETTLE = timedelta(seconds=60)


@dataclass
class ArchiveResult:
    before: datetime
    archived: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TABLES, 0))
    written: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TABLES, 0))
    waiting_messages: int = 0  # messages with a delivery still under way: not archived yet


def run_archive(spark: SparkSession, settings: AnalyticsSettings, before: datetime,
                progress: Progress | None = None, now: datetime | None = None) -> ArchiveResult:
    progress = progress or Progress()
    now = now or datetime.now(UTC)
    before = min(before, now)
    result = ArchiveResult(before)
    with AnalyticsStore(settings.mongo_uri, settings.mongo_db, tz_aware=True) as store:
        store.ensure_retention(settings.retention_after_archive_s)
        start = store.oldest_unarchived_message(before)
        if start is None:
            progress.step(f"nothing to archive before {before.isoformat()}")
            return result
        attempts_end = now - _ATTEMPT_SETTLE
        progress.step(f"archiving records of {start.isoformat()} .. {before.isoformat()} "
                      f"to {settings.archive_dir}")
        batch = _candidates(spark, settings, start, before, attempts_end)
        try:
            _check_read_counts(store, batch, start, before, attempts_end, progress)
            result.waiting_messages = batch.waiting_messages
            for table in TABLES:
                result.written[table] = _write_new_rows(
                    spark, settings.archive_dir, table, batch.frames[table], start)
                progress.step(f"{table}: {batch.counts[table]} to archive, "
                              f"{result.written[table]} rows written")
            _verify_archive(spark, settings.archive_dir, batch, start)
            progress.step("archive verified: every record of this run is readable there")
            marked_at = datetime.now(UTC).replace(microsecond=0)
            for table in reversed(TABLES):  # messages last: they are what a rerun starts from
                _mark(batch.frames[table], settings, table, marked_at)
                result.archived[table] = batch.counts[table]
            progress.step(f"marked archived at {marked_at.isoformat()}: {result.archived}")
        finally:
            batch.release()
    return result


@dataclass
class _Batch:
    frames: dict[str, DataFrame]
    counts: dict[str, int]
    read_counts: dict[str, int]
    waiting_messages: int

    def release(self) -> None:
        for frame in self.frames.values():
            frame.unpersist()


def _candidates(spark: SparkSession, settings: AnalyticsSettings, start: datetime,
                before: datetime, attempts_end: datetime) -> _Batch:
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    location = mongo_location(spark, settings)
    not_archived = F.col(ARCHIVED_AT).isNull()  # pushed down to MongoDB
    raw = {
        "messages": read_collection(spark, location, "messages", start, before),
        "deliveries": read_collection(spark, location, "deliveries", start, before),
        "attempts": read_collection(spark, location, "attempts", start,
                                    max(attempts_end, before)),
    }
    # every delivery state of the range, archived or not: a rerun after a crash between
    # marking the deliveries and their messages must still see the states
    states = read_collection(spark, location, "deliveries", start, before).select(
        "message_id", "subscription")
    raw = {name: frame.where(not_archived).persist(StorageLevel.MEMORY_AND_DISK)
           for name, frame in raw.items()}
    read_counts = {name: frame.count() for name, frame in raw.items()}
    under_way = [s.value for s in OPEN_STATUSES]
    in_flight = (raw["deliveries"].where(F.col("status").isin(under_way))
                 .select(F.col("message_id").alias("_id")))
    # a subscription the message was recorded for that has no delivery state yet: pending
    wanted = raw["messages"].select(F.col("_id").alias("message_id"),
                                    F.explode("subscriptions").alias("subscription"))
    no_state = (wanted.join(states, ["message_id", "subscription"], "left_anti")
                .select(F.col("message_id").alias("_id")))
    waiting = in_flight.union(no_state).distinct()
    messages = raw["messages"].join(waiting, "_id", "left_anti")
    ids = messages.select(F.col("_id").alias("message_id"))
    deliveries = raw["deliveries"].join(ids, "message_id", "left_semi")
    attempts = raw["attempts"].join(ids, "message_id", "left_semi")
    frames = {
        "messages": messages.withColumn(DATE_COLUMN, F.to_date("created_at")),
        "deliveries": deliveries.withColumn(DATE_COLUMN, F.to_date("created_at")),
        "attempts": attempts.withColumn(DATE_COLUMN, F.to_date("started_at")).withColumn(
            DESTINATION_COLUMN, F.split_part("subscription", F.lit("/"), F.lit(1))),
    }
    frames = {name: frame.persist(StorageLevel.MEMORY_AND_DISK) for name, frame in frames.items()}
    counts = {name: frame.count() for name, frame in frames.items()}
    for frame in raw.values():
        frame.unpersist()
    return _Batch(frames, counts, read_counts,
                  waiting_messages=read_counts["messages"] - counts["messages"])


def _check_read_counts(store: AnalyticsStore, batch: _Batch, start: datetime, before: datetime,
                       attempts_end: datetime, progress: Progress) -> None:
    """What Spark read must be what MongoDB counts for the same queries."""
    counts = store.count_unarchived(start, before, max(attempts_end, before))
    for table, expected in counts.items():
        if expected != batch.read_counts[table]:
            raise ArchiveMismatch(f"{table}: read {batch.read_counts[table]} records, MongoDB "
                                  f"counts {expected}; nothing was written or marked")
    progress.step(f"read {batch.read_counts} (equal to MongoDB's counts); "
                  f"{batch.waiting_messages} messages wait for deliveries under way")


def _table_path(archive_dir: Path, table: str) -> str:
    return str(Path(archive_dir) / table)


def _archived_ids(spark: SparkSession, archive_dir: Path, table: str,
                  since: datetime) -> DataFrame | None:
    from pyspark.sql import functions as F

    if not (Path(archive_dir) / table).exists():
        return None
    return (spark.read.parquet(_table_path(archive_dir, table))
            .where(F.col(DATE_COLUMN) >= F.lit(since.date())).select("_id"))


def _write_new_rows(spark: SparkSession, archive_dir: Path, table: str, frame: DataFrame,
                    since: datetime) -> int:
    existing = _archived_ids(spark, archive_dir, table, since)
    new_rows = frame if existing is None else frame.join(existing, "_id", "left_anti")
    new_rows = new_rows.drop(ARCHIVED_AT).cache()
    try:
        count = new_rows.count()
        if count:
            (new_rows.repartition(DATE_COLUMN, DESTINATION_COLUMN).write
             .partitionBy(DATE_COLUMN, DESTINATION_COLUMN).mode("append")
             .parquet(_table_path(archive_dir, table)))
        return count
    finally:
        new_rows.unpersist()


def _verify_archive(spark: SparkSession, archive_dir: Path, batch: _Batch,
                    since: datetime) -> None:
    for table, frame in batch.frames.items():
        if batch.counts[table] == 0:
            continue
        archived = _archived_ids(spark, archive_dir, table, since)
        found = 0 if archived is None else (
            frame.select("_id").join(archived.distinct(), "_id", "left_semi").count())
        if found != batch.counts[table]:
            raise ArchiveMismatch(f"{table}: {batch.counts[table]} records to archive, "
                                  f"{found} found in the archive; nothing was marked")


def _mark(frame: DataFrame, settings: AnalyticsSettings, table: str,
          marked_at: datetime) -> None:
    mark = functools.partial(_mark_partition, settings.mongo_uri, settings.mongo_db, table,
                             marked_at)
    frame.select("_id").foreachPartition(mark)


def _mark_partition(uri: str, database: str, collection: str, marked_at: datetime,
                    rows: Iterable[Any]) -> None:
    """Runs on the executors: set archived_at on this partition's records, in chunks."""
    with AnalyticsStore(uri, database, tz_aware=True) as store:
        store.mark_archived(collection, (row["_id"] for row in rows), marked_at)
