"""The statistics' Spark SQL.

One pass over the raw records builds small "cells" per (destination, subscription, hour, outcome,
value bucket) with a count; every level (bus, destination, subscription) and granularity (hour,
day, total) is then computed from the cells with GROUPING SETS. Percentiles come from the cells'
histograms: a value is kept to 3 significant digits (relative error ≤ 0.5 %), and the p-th
percentile is the smallest bucket whose cumulative count reaches p of the total (nearest rank).
This replaced `percentile_approx` over grouping sets, which took 10-60 s on a million rows here
(an object aggregate per group, falling back to sorting).
"""

from __future__ import annotations

PERCENTILES = (50, 95, 99)

# what each (level, granularity) is grouped by; `day` is derived from `hour`
_BY_SUBSCRIPTION = (("destination", "subscription", "hour"), ("destination", "subscription", "day"),
                    ("destination", "subscription"), ("destination", "hour"),
                    ("destination", "day"), ("destination",), ("hour",), ("day",), ())
_BY_DESTINATION = (("destination", "hour"), ("destination", "day"), ("destination",), ("hour",),
                   ("day",), ())


def _sets(groups: tuple[tuple[str, ...], ...], extra: tuple[str, ...] = ()) -> str:
    return ", ".join("(" + ", ".join((*g, *extra)) + ")" for g in groups)


def _bucket(value: str) -> str:
    """`value` to 3 significant digits (0 for values ≤ 0, e.g. a clock skew)."""
    scale = f"pow(10, floor(log10({value})) - 2)"
    return (f"CASE WHEN {value} IS NULL THEN NULL WHEN {value} <= 0 THEN 0.0 "
            f"ELSE round({value} / {scale}) * {scale} END")


def _level(with_subscription: bool) -> str:
    subscription = "grouping(subscription) = 1" if with_subscription else "true"
    return f"""
    CASE WHEN grouping(destination) = 1 THEN 'bus'
         WHEN {subscription} THEN 'destination' ELSE 'subscription' END AS level,
    CASE WHEN grouping(hour) = 0 THEN 'hour' WHEN grouping(day) = 0 THEN 'day'
         ELSE 'total' END AS granularity,
    coalesce(hour, day) AS period_start"""


KEYS = ["level", "granularity", "period_start", "destination", "subscription"]

MESSAGES_IN = f"""
SELECT {_level(False)}, destination, count(*) AS messages, coalesce(sum(size), 0) AS bytes
FROM (SELECT destination, size, date_trunc('hour', created_at) AS hour,
             date_trunc('day', created_at) AS day FROM stats_messages)
GROUP BY GROUPING SETS ({_sets(_BY_DESTINATION)})
"""

DELIVERY_CELLS = f"""
SELECT destination, subscription, hour, status, attempts, {_bucket("delivery_ms")} AS bucket,
       count(*) AS n
FROM (
    SELECT d.destination, d.subscription, d.status, d.attempts,
        date_trunc('hour', d.created_at) AS hour,
        CASE WHEN d.status = 'delivered' THEN (unix_micros(d.delivered_at)
            - unix_micros(coalesce(m.received_at, d.created_at))) / 1000.0 END AS delivery_ms
    FROM stats_deliveries d LEFT JOIN stats_messages m ON m._id = d.message_id
    UNION ALL
    -- pending: a subscription the message was recorded for, without a delivery state yet
    SELECT w.destination, w.subscription, 'pending' AS status, 0 AS attempts,
        date_trunc('hour', w.created_at) AS hour, CAST(NULL AS DOUBLE) AS delivery_ms
    FROM (SELECT _id, destination, created_at, explode(subscriptions) AS subscription
          FROM stats_messages) w
    LEFT ANTI JOIN stats_deliveries d ON d.message_id = w._id AND d.subscription = w.subscription)
GROUP BY destination, subscription, hour, status, attempts, bucket
"""

PUSH_CELLS = f"""
SELECT split_part(subscription, '/', 1) AS destination, subscription,
       date_trunc('hour', started_at) AS hour, ok, {_bucket("latency_ms")} AS bucket,
       count(*) AS n, max(latency_ms) AS max_ms
FROM stats_attempts
GROUP BY destination, subscription, hour, ok, bucket
"""

_WITH_DAY = "(SELECT *, date_trunc('day', hour) AS day FROM {cells} {where})"


def delivery_counts(statuses: tuple[str, ...]) -> str:
    by_status = ",\n    ".join(f"coalesce(sum(n) FILTER (WHERE status = '{s}'), 0) AS {s}"
                               for s in statuses)
    return f"""
SELECT {_level(True)}, destination, subscription, sum(n) AS deliveries,
    {by_status},
    try_divide(coalesce(sum(n) FILTER (WHERE status = 'delivered'), 0),
               sum(n) FILTER (WHERE status <> 'skipped')) AS success_rate
FROM {_WITH_DAY.format(cells="stats_delivery_cells", where="")}
GROUP BY GROUPING SETS ({_sets(_BY_SUBSCRIPTION)})
"""


PUSH_COUNTS = f"""
SELECT {_level(True)}, destination, subscription, sum(n) AS attempts,
    coalesce(sum(n) FILTER (WHERE NOT ok), 0) AS failed_attempts,
    try_divide(coalesce(sum(n) FILTER (WHERE ok), 0), sum(n)) AS ok_rate,
    max(max_ms) AS latency_ms_max
FROM {_WITH_DAY.format(cells="stats_push_cells", where="")}
GROUP BY GROUPING SETS ({_sets(_BY_SUBSCRIPTION)})
"""


def percentiles(cells: str, name: str, where: str = "") -> str:
    """`name`_p50/_p95/_p99 per level and granularity from the histogram in `cells`."""
    condition = "WHERE bucket IS NOT NULL" + (f" AND {where}" if where else "")
    group = ", ".join(KEYS)
    picks = ",\n    ".join(f"min(bucket) FILTER (WHERE cum >= {p / 100} * total) AS {name}_p{p}"
                           for p in PERCENTILES)
    return f"""
WITH per_set AS (
    SELECT {_level(True)}, destination, subscription, bucket, sum(n) AS n
    FROM {_WITH_DAY.format(cells=cells, where=condition)}
    GROUP BY GROUPING SETS ({_sets(_BY_SUBSCRIPTION, ("bucket",))})
), ranked AS (
    SELECT *,
        sum(n) OVER (PARTITION BY {group} ORDER BY bucket
                     ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS cum,
        sum(n) OVER (PARTITION BY {group}) AS total
    FROM per_set
)
SELECT {group},
    {picks}
FROM ranked GROUP BY {group}
"""


ATTEMPTS_UNTIL_SUCCESS = """
SELECT destination, subscription, attempts, sum(n) AS deliveries
FROM stats_delivery_cells WHERE status = 'delivered'
GROUP BY destination, subscription, attempts
ORDER BY destination, subscription, attempts
"""
