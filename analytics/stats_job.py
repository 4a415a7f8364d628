"""`msgbus analytics stats`: read the records of a time range, compute the statistics, write
them as Parquet (one file per table) and an HTML report."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from analytics.inputs import archive_inputs, mongo_inputs
from analytics.progress import Progress
from analytics.report import write_report
from analytics.session import mongo_location
from analytics.settings import AnalyticsSettings
from analytics.stats import StatsInputs, StatsTables, compute_stats

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

Source = Literal["mongo", "archive"]
REPORT_FILE = "report.html"
PARQUET_DIR = "parquet"


@dataclass(frozen=True)
class StatsRun:
    tables: StatsTables
    parquet_dir: Path | None
    report: Path | None


def load_inputs(spark: SparkSession, settings: AnalyticsSettings, source: Source,
                start: datetime, end: datetime) -> StatsInputs:
    """Fresh DataFrames (never reuse one for another query: see analytics.mongo_source).
    Messages are used by two aggregations: cached, so that MongoDB is read once."""
    from pyspark import StorageLevel

    if source == "mongo":
        inputs = mongo_inputs(spark, mongo_location(spark, settings), start, end)
    else:
        inputs = archive_inputs(spark, settings.archive_dir, start, end)
    return StatsInputs(messages=inputs.messages.persist(StorageLevel.MEMORY_AND_DISK),
                       deliveries=inputs.deliveries, attempts=inputs.attempts)


def run_stats(spark: SparkSession, settings: AnalyticsSettings, start: datetime,
              end: datetime, *, source: Source = "mongo", out_dir: Path | None = None,
              progress: Progress | None = None) -> StatsRun:
    """With `out_dir` None nothing is written (the benchmark times the computation alone)."""
    progress = progress or Progress()
    where = (f"MongoDB {settings.mongo_db}" if source == "mongo"
             else f"archive {settings.archive_dir}")
    progress.step(f"statistics of {start.isoformat()} .. {end.isoformat()} from {where}")
    inputs = load_inputs(spark, settings, source, start, end)
    try:
        tables = compute_stats(spark, inputs, top=settings.top_subscribers, say=progress.step)
    finally:
        inputs.messages.unpersist()
    if out_dir is None:
        return StatsRun(tables, None, None)
    parquet_dir = out_dir / PARQUET_DIR
    parquet_dir.mkdir(parents=True, exist_ok=True)
    for name, table in tables.named().items():
        table.to_parquet(parquet_dir / f"{name}.parquet", index=False)
    progress.step(f"wrote {len(tables.named())} tables to {parquet_dir}")
    report = write_report(out_dir / REPORT_FILE, tables, start, end, where)
    progress.step(f"wrote the report {report}")
    return StatsRun(tables, parquet_dir, report)
