"""Where the statistics read the bus's records from: MongoDB (the live records) or the archive
(Parquet, `analytics.archive`). Both give the `*_STATS` columns of [start, end)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from analytics.errors import NotInArchive
from analytics.mongo_source import MongoLocation, read_collection
from analytics.schemas import ATTEMPTS_STATS, COLLECTIONS, DELIVERIES_STATS, MESSAGES_STATS
from analytics.stats import StatsInputs

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

DATE_COLUMN = "date"  # the archive's partition columns: date (of the record's time), destination
DESTINATION_COLUMN = "destination"


def mongo_inputs(spark: SparkSession, location: MongoLocation, start: datetime,
                 end: datetime) -> StatsInputs:
    return StatsInputs(
        messages=read_collection(spark, location, "messages", start, end, MESSAGES_STATS),
        deliveries=read_collection(spark, location, "deliveries", start, end, DELIVERIES_STATS),
        attempts=read_collection(spark, location, "attempts", start, end, ATTEMPTS_STATS))


def archive_inputs(spark: SparkSession, archive_dir: Path | str, start: datetime,
                   end: datetime) -> StatsInputs:
    def table(collection: str) -> DataFrame:
        time_field, _, schema = COLLECTIONS[collection]
        return archive_table(spark, archive_dir, collection, start, end, time_field).select(
            *schema.fieldNames())

    return StatsInputs(table("messages"), table("deliveries"), table("attempts"))


def archive_path(archive_dir: Path | str, collection: str) -> str:
    path = Path(archive_dir) / collection
    if not path.is_dir():
        raise NotInArchive(f"no archive of {collection} in {archive_dir} "
                           f"(`msgbus analytics archive` writes it)")
    return str(path)


def archive_table(spark: SparkSession, archive_dir: Path | str, collection: str,
                  start: datetime | None = None, end: datetime | None = None,
                  time_field: str | None = None) -> DataFrame:
    """One archived collection; with a range, only its days' partitions are read."""
    from pyspark.sql import functions as F

    frame = spark.read.parquet(archive_path(archive_dir, collection))
    if start is not None and end is not None:
        field = time_field or COLLECTIONS[collection][0]
        frame = frame.where(
            (F.col(DATE_COLUMN) >= F.lit(start.date())) & (F.col(DATE_COLUMN) <= F.lit(end.date()))
            & (F.col(field) >= F.lit(start)) & (F.col(field) < F.lit(end)))
    return frame
