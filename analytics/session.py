"""The SparkSession of the analytics jobs: UTC everywhere, Arrow on, the MongoDB source
registered, Python filter pushdown enabled, and few shuffle partitions (the aggregates are
small)."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from analytics.mongo_source import MongoLocation, register
from analytics.settings import AnalyticsSettings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

APP_NAME = "msgbus-analytics"


def build_spark(settings: AnalyticsSettings) -> SparkSession:
    # Executors' Python must be the one with the analytics package and pymongo (this venv's),
    # not whatever `python3` the PATH finds first.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(settings.master).appName(APP_NAME)
        .config("spark.driver.memory", settings.driver_memory)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", "-Duser.timezone=UTC")
        .config("spark.executor.extraJavaOptions", "-Duser.timezone=UTC")
        .config("spark.sql.python.filterPushdown.enabled", "true")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.shuffle.partitions", str(settings.shuffle_partitions))
        .config("spark.sql.adaptive.enabled", "true")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.sources.partitionOverwriteMode", "dynamic")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def mongo_location(spark: SparkSession, settings: AnalyticsSettings) -> MongoLocation:
    partitions = settings.read_partitions or spark.sparkContext.defaultParallelism
    return MongoLocation(settings.mongo_uri, settings.mongo_db, partitions,
                         settings.read_batch_rows)
