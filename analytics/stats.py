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
its `period_start`). Percentiles are Spark's `percentile_approx` (rank error ≤ 1/10,000).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pandas as pd

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

STATUSES = ("delivered", "failed", "retrying", "pending", "parked", "skipped", "discarded")
PERCENTILE_ACCURACY = 10_000
# (destination, subscription) x (hour, day, all): every level and granularity in one pass
_SETS_BY_SUBSCRIPTION = ("(destination, subscription, hour), (destination, subscription, day),"
                         " (destination, subscription), (destination, hour), (destination, day),"
                         " (destination), (hour), (day), ()")
_SETS_BY_DESTINATION = "(destination, hour), (destination, day), (destination), (hour), (day), ()"


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
    messages_in = _collect(spark, _MESSAGES_IN_SQL.format(sets=_SETS_BY_DESTINATION))
    step("deliveries by outcome, success rate, acceptance -> delivered time")
    deliveries = _collect(spark, _DELIVERIES_SQL.format(
        sets=_SETS_BY_SUBSCRIPTION, status_counts=_status_counts(),
        accuracy=PERCENTILE_ACCURACY))
    step("pushes: attempts, failures, latency percentiles")
    pushes = _collect(spark, _PUSHES_SQL.format(sets=_SETS_BY_SUBSCRIPTION,
                                                accuracy=PERCENTILE_ACCURACY))
    step("attempts until success")
    attempts_until_success: pd.DataFrame = spark.sql(_ATTEMPTS_UNTIL_SUCCESS_SQL).toPandas()
    return StatsTables(
        messages_in=messages_in, deliveries=deliveries, pushes=pushes,
        attempts_until_success=attempts_until_success,
        slowest_subscribers=slowest_subscribers(pushes, top),
        most_failing_subscribers=most_failing_subscribers(deliveries, pushes, top))


def _status_counts() -> str:
    return ",\n".join(f"count_if(d.status = '{s}') AS {s}" for s in STATUSES)


_LEVEL_COLUMNS = """
    CASE WHEN grouping(destination) = 1 THEN 'bus'
         WHEN {subscription_grouped} THEN 'destination' ELSE 'subscription' END AS level,
    CASE WHEN grouping(hour) = 0 THEN 'hour' WHEN grouping(day) = 0 THEN 'day'
         ELSE 'total' END AS granularity,
    coalesce(hour, day) AS period_start"""

_MESSAGES_IN_SQL = """
SELECT {level}, destination, count(*) AS messages, coalesce(sum(size), 0) AS bytes
FROM (SELECT destination, size, date_trunc('hour', created_at) AS hour,
             date_trunc('day', created_at) AS day FROM stats_messages)
GROUP BY GROUPING SETS ({{sets}})
""".format(level=_LEVEL_COLUMNS.format(subscription_grouped="true"))

_DELIVERIES_SQL = """
SELECT {level}, destination, subscription, count(*) AS deliveries,
    {{status_counts}},
    try_divide(count_if(status = 'delivered'), count_if(status <> 'skipped')) AS success_rate,
    percentile_approx(delivery_ms, array(0.5, 0.95, 0.99), {{accuracy}}) AS delivery_ms_pct
FROM (
    SELECT d.destination, d.subscription, d.status,
        date_trunc('hour', d.created_at) AS hour, date_trunc('day', d.created_at) AS day,
        CASE WHEN d.status = 'delivered' THEN (unix_micros(d.delivered_at)
            - unix_micros(coalesce(m.received_at, d.created_at))) / 1000.0 END AS delivery_ms
    FROM stats_deliveries d LEFT JOIN stats_messages m ON m._id = d.message_id
) d
GROUP BY GROUPING SETS ({{sets}})
""".format(level=_LEVEL_COLUMNS.format(subscription_grouped="grouping(subscription) = 1"))

_PUSHES_SQL = """
SELECT {level}, destination, subscription, count(*) AS attempts,
    count_if(NOT ok) AS failed_attempts, try_divide(count_if(ok), count(*)) AS ok_rate,
    percentile_approx(latency_ms, array(0.5, 0.95, 0.99), {{accuracy}}) AS latency_ms_pct,
    max(latency_ms) AS latency_ms_max
FROM (
    SELECT split_part(subscription, '/', 1) AS destination, subscription, ok, latency_ms,
        date_trunc('hour', started_at) AS hour, date_trunc('day', started_at) AS day
    FROM stats_attempts
)
GROUP BY GROUPING SETS ({{sets}})
""".format(level=_LEVEL_COLUMNS.format(subscription_grouped="grouping(subscription) = 1"))

_ATTEMPTS_UNTIL_SUCCESS_SQL = """
SELECT destination, subscription, attempts, count(*) AS deliveries
FROM stats_deliveries WHERE status = 'delivered'
GROUP BY destination, subscription, attempts
ORDER BY destination, subscription, attempts
"""


def _collect(spark: SparkSession, sql: str) -> pd.DataFrame:
    table: pd.DataFrame = spark.sql(sql).toPandas()
    for column in [c for c in table.columns if c.endswith("_pct")]:
        stem = column.removesuffix("_pct")
        for index, name in enumerate(("p50", "p95", "p99")):
            table[f"{stem}_{name}"] = table[column].map(
                lambda values, i=index: None if values is None else float(values[i]))
        table = table.drop(columns=[column])
    if "period_start" in table.columns:
        table["period_start"] = pd.to_datetime(table["period_start"], utc=True)
    order = [c for c in ("level", "destination", "subscription", "granularity", "period_start")
             if c in table.columns]
    return table.sort_values(order, na_position="first", kind="stable").reset_index(drop=True)


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
