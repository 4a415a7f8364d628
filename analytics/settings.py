"""Settings of the analytics jobs (`msgbus analytics ...`), from `MSGBUS_ANALYTICS_*` variables.

Where MongoDB is comes from the shared `ConnectionSettings` (`MSGBUS_MONGO_URI`, `MSGBUS_MONGO_DB`).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class AnalyticsSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MSGBUS_ANALYTICS_", extra="ignore")

    mongo_uri: str = "mongodb://127.0.0.1:27017"
    mongo_db: str = "msgbus"
    master: str = Field(default="local[*]", description="Spark master URL")
    driver_memory: str = "1g"
    shuffle_partitions: int = Field(
        default=8, ge=1, description="spark.sql.shuffle.partitions: the aggregates are small; "
                                     "Spark's default of 200 costs seconds of task overhead")
    read_partitions: int = Field(
        default=0, ge=0, description="time slices each MongoDB read is split into, read in "
                                     "parallel; 0: as many as Spark has cores")
    read_batch_rows: int = Field(default=10_000, ge=100, le=1_000_000,
                                 description="rows per Arrow batch (and MongoDB cursor batch)")
    archive_dir: Path = Path(".msgbus/archive")
    out_dir: Path = Path(".msgbus/analytics")
    # What retention keeps after a record is archived: MongoDB's TTL monitor removes records
    # whose archived_at is older than this; records never archived carry no archived_at and stay.
    retention_after_archive_s: int = Field(default=7 * 86400, ge=0)
    top_subscribers: int = Field(default=10, ge=1, description="rows of the slowest / most "
                                                               "failing subscriber rankings")
