"""Spark filters pushed to the MongoDB source, as MongoDB query clauses.

Spark does not evaluate a filter again once the source has accepted it, so a translation must
select exactly the rows Spark would: SQL's `a <> 1` drops rows where `a` is null, MongoDB's
`$ne` keeps them; hence `$nin: [1, None]`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pyspark.sql.datasource import (
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringStartsWith,
)

_COMPARISONS: dict[type[Filter], str] = {
    GreaterThan: "$gt", GreaterThanOrEqual: "$gte", LessThan: "$lt", LessThanOrEqual: "$lte",
}


@dataclass(frozen=True)
class Pushed:
    """The clauses the source applies, and the filters Spark must still apply itself."""

    clauses: list[dict[str, Any]]
    remaining: list[Filter]


def push(filters: list[Filter], columns: set[str]) -> Pushed:
    clauses: list[dict[str, Any]] = []
    remaining: list[Filter] = []
    for spark_filter in filters:
        clause = to_mongo(spark_filter, columns)
        if clause is None:
            remaining.append(spark_filter)
        else:
            clauses.append(clause)
    return Pushed(clauses, remaining)


def to_mongo(spark_filter: Filter, columns: set[str]) -> dict[str, Any] | None:
    """The MongoDB clause equal to `spark_filter`, or None when it has no exact translation."""
    if isinstance(spark_filter, Not):
        return _negation(spark_filter.child, columns)
    column = _column(spark_filter, columns)
    if column is None:
        return None
    if isinstance(spark_filter, EqualTo):
        return {column: {"$eq": _value(spark_filter.value)}}
    if isinstance(spark_filter, In):
        return {column: {"$in": [_value(v) for v in spark_filter.value]}}
    operator = _COMPARISONS.get(type(spark_filter))
    if operator is not None:
        return {column: {operator: _value(getattr(spark_filter, "value"))}}  # noqa: B009
    if isinstance(spark_filter, IsNull):
        return {column: None}  # matches a missing field too, as the source reads it
    if isinstance(spark_filter, IsNotNull):
        return {column: {"$ne": None}}
    if isinstance(spark_filter, StringStartsWith):
        return {column: {"$regex": "^" + re.escape(spark_filter.value)}}
    return None


def _negation(child: Filter, columns: set[str]) -> dict[str, Any] | None:
    column = _column(child, columns)
    if column is None:
        return None
    if isinstance(child, EqualTo):
        return {column: {"$nin": [_value(child.value), None]}}
    if isinstance(child, In):
        return {column: {"$nin": [*(_value(v) for v in child.value), None]}}
    return None


def _column(spark_filter: Filter, columns: set[str]) -> str | None:
    """The top-level column a filter tests; None for nested paths and unknown columns."""
    attribute = getattr(spark_filter, "attribute", None)
    if attribute is None or len(attribute) != 1 or attribute[0] not in columns:
        return None
    return str(attribute[0])


def _value(value: Any) -> Any:
    # Spark hands timestamps over as naive datetimes in the session's time zone, which the
    # analytics session pins to UTC; MongoDB compares them as UTC either way.
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    if isinstance(value, tuple | list):
        return [_value(v) for v in value]
    return value
