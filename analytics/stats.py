"""Delivery statistics from the bus's records, per destination, subscription, hour and day.

Inputs are three DataFrames with the `*_STATS` columns of `analytics.schemas`, from MongoDB or
from the archive: the same aggregation runs on either. Each record counts in the hour of its own
time: a message and its deliveries by `created_at` (the acceptance time the bus keeps for both),
an attempt (one push) by `started_at`.

Tables (pandas DataFrames, small: the aggregation happens in Spark):
- messages_in: messages and bytes accepted.
- deliveries: deliveries by outcome (status), success rate (delivered of those not skipped),
  time from acceptance to successful delivery p50/p95/p99.
- pushes: attempts, failed attempts, push latency p50/p95/p99 and max.
- attempts_until_success: delivered deliveries by how many attempts they took.
- slowest_subscribers, most_failing_subscribers: rankings of subscriptions over the range.

Rows have a `level` (bus, destination, subscription) and a `granularity` (total, day, hour with
its `period_start`). Percentiles are nearest-rank over values kept to 3 significant digits
(≤ 0.5 % off; see analytics/stats_sql.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd

from analytics import stats_sql as sql

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

STATUSES = ("delivered", "failed", "retrying", "pending", "parked", "skipped", "discarded",
            "scheduled")


@dataclass(frozen=True)
class StatsInputs:
    messages: DataFrame
    deliveries: DataFrame
    attempts: DataFrame


@dataclass(frozen=True)
class StatsTables:
    messages_in: pd.DataFrame
    deliveries: pd.DataFrame
    pushes: pd.DataFrame
    attempts_until_success: pd.DataFrame
    slowest_subscribers: pd.DataFrame
    most_failing_subscribers: pd.DataFrame

    def named(self) -> dict[str, pd.DataFrame]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def compute_stats(spark: SparkSession, inputs: StatsInputs, *, top: int = 10,
                  say: object = None) -> StatsTables:
    """All tables; `say(text)`, if given, is told each step."""
    def step(text: str) -> None:
        if callable(say):
            say(text)

    inputs.messages.createOrReplaceTempView("stats_messages")
    inputs.deliveries.createOrReplaceTempView("stats_deliveries")
    inputs.attempts.createOrReplaceTempView("stats_attempts")
    step("messages in, per destination and hour/day")
    messages_in = _collect(spark, sql.MESSAGES_IN)
    step("deliveries: outcomes and acceptance -> delivered times, per subscription and hour")
    delivery_cells = spark.sql(sql.DELIVERY_CELLS).cache()
    push_cells = spark.sql(sql.PUSH_CELLS).cache()
    try:
        step(f"  {delivery_cells.count():,} cells")  # the pass over the deliveries, here
        step("pushes: outcomes and latencies, per subscription and hour")
        step(f"  {push_cells.count():,} cells")
        delivery_cells.createOrReplaceTempView("stats_delivery_cells")
        push_cells.createOrReplaceTempView("stats_push_cells")
        deliveries = _merge(_collect(spark, sql.delivery_counts(STATUSES)), _collect(
            spark, sql.percentiles("stats_delivery_cells", "delivery_ms",
                                   "status = 'delivered'")))
        step("rolled up per destination, bus, day and the whole range")
        pushes = _merge(_collect(spark, sql.PUSH_COUNTS),
                        _collect(spark, sql.percentiles("stats_push_cells", "latency_ms")))
        attempts_until_success: pd.DataFrame = spark.sql(sql.ATTEMPTS_UNTIL_SUCCESS).toPandas()
    finally:
        delivery_cells.unpersist()
        push_cells.unpersist()
    return StatsTables(
        messages_in=messages_in, deliveries=deliveries, pushes=pushes,
        attempts_until_success=attempts_until_success,
        slowest_subscribers=slowest_subscribers(pushes, top),
        most_failing_subscribers=most_failing_subscribers(deliveries, pushes, top))


def _collect(spark: SparkSession, query: str) -> pd.DataFrame:
    table: pd.DataFrame = spark.sql(query).toPandas()
    if "period_start" in table.columns:
        table["period_start"] = pd.to_datetime(table["period_start"], utc=True)
    keys = [k for k in sql.KEYS if k in table.columns]
    return table.sort_values(keys, na_position="first", kind="stable").reset_index(drop=True)


def _merge(counts: pd.DataFrame, percentiles: pd.DataFrame) -> pd.DataFrame:
    keys = [k for k in sql.KEYS if k in counts.columns]
    table = counts.merge(percentiles, on=keys, how="left")
    return table.sort_values(keys, na_position="first", kind="stable").reset_index(drop=True)


def slowest_subscribers(pushes: pd.DataFrame, top: int) -> pd.DataFrame:
    totals = _subscription_totals(pushes)
    columns = ["destination", "subscription", "attempts", "latency_ms_p50", "latency_ms_p95",
               "latency_ms_p99", "latency_ms_max"]
    return (totals.sort_values(["latency_ms_p95", "latency_ms_p99"], ascending=False)
            .head(top)[columns].reset_index(drop=True))


def most_failing_subscribers(deliveries: pd.DataFrame, pushes: pd.DataFrame,
                             top: int) -> pd.DataFrame:
    """Ranked by failed pushes, then by deliveries not (yet) delivered."""
    push_totals = _subscription_totals(pushes)[
        ["destination", "subscription", "attempts", "failed_attempts", "ok_rate"]]
    delivery_totals = _subscription_totals(deliveries)
    delivery_totals = delivery_totals.assign(
        undelivered=delivery_totals[["failed", "retrying", "pending", "parked"]].sum(axis=1)
    )[["destination", "subscription", "deliveries", "undelivered", "parked", "success_rate"]]
    merged = delivery_totals.merge(push_totals, on=["destination", "subscription"], how="outer")
    merged = merged.fillna({"attempts": 0, "failed_attempts": 0, "deliveries": 0,
                            "undelivered": 0, "parked": 0})
    failing = merged[(merged["failed_attempts"] > 0) | (merged["undelivered"] > 0)]
    return (failing.sort_values(["failed_attempts", "undelivered"], ascending=False)
            .head(top).reset_index(drop=True))


def _subscription_totals(table: pd.DataFrame) -> pd.DataFrame:
    mask = (table["level"] == "subscription") & (table["granularity"] == "total")
    return table[mask]
