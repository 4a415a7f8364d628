"""Spark and Arrow schemas of the bus's records, as `msgbus/store/documents.py` writes them.

Columns carry the MongoDB field names (`_id` included). A `*_FULL` schema holds every field the
bus writes (the archive); a `*_STATS` schema only what the statistics need, so the MongoDB
source asks the server for less. `EXTRA_COLUMN`, where a schema has it, receives every other
field of the document as JSON, so that an archived record loses nothing.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from msgbus.store.analytics import ARCHIVED_AT

EXTRA_COLUMN = "extra"
# Arrow's timestamps must be microseconds in UTC: Spark's TimestampType, whatever the session's
# time zone; naive datetimes (pymongo's default) are taken as UTC.
ARROW_TIMESTAMP = pa.timestamp("us", tz="UTC")


def _schema(*fields: tuple[str, DataType]) -> StructType:
    return StructType([StructField(name, kind, nullable=name != "_id") for name, kind in fields])


_S, _T, _L, _D = StringType(), TimestampType(), LongType(), DoubleType()

MESSAGES_FULL = _schema(
    ("_id", _S), ("destination", _S), ("biz_id", _S), ("source_app", _S), ("created_at", _T),
    ("received_at", _T), ("content_type", _S), ("headers", _S), ("body", BinaryType()),
    ("size", _L), ("subscriptions", ArrayType(_S)), (ARCHIVED_AT, _T), (EXTRA_COLUMN, _S))
MESSAGES_STATS = _schema(
    ("_id", _S), ("destination", _S), ("created_at", _T), ("received_at", _T), ("size", _L),
    ("subscriptions", ArrayType(_S)))

DELIVERIES_FULL = _schema(
    ("_id", _S), ("message_id", _S), ("subscription", _S), ("destination", _S), ("biz_id", _S),
    ("status", _S), ("attempts", _L), ("created_at", _T), ("updated_at", _T),
    ("delivered_at", _T), ("last_status_code", _L), ("last_error", _S),
    ("last_latency_ms", _D), ("last_attempt_at", _T), ("next_attempt_at", _T),
    (ARCHIVED_AT, _T), (EXTRA_COLUMN, _S))
DELIVERIES_STATS = _schema(
    ("_id", _S), ("message_id", _S), ("subscription", _S), ("destination", _S), ("status", _S),
    ("attempts", _L), ("created_at", _T), ("delivered_at", _T))

ATTEMPTS_FULL = _schema(
    ("_id", _S), ("message_id", _S), ("subscription", _S), ("attempt", _L), ("started_at", _T),
    ("latency_ms", _D), ("status_code", _L), ("error", _S), ("instance", _S),
    ("ok", BooleanType()), (ARCHIVED_AT, _T), (EXTRA_COLUMN, _S))
ATTEMPTS_STATS = _schema(
    ("_id", _S), ("subscription", _S), ("started_at", _T), ("latency_ms", _D),
    ("ok", BooleanType()))

# collection -> (the time field its reads are split on, full schema, statistics schema)
COLLECTIONS: dict[str, tuple[str, StructType, StructType]] = {
    "messages": ("created_at", MESSAGES_FULL, MESSAGES_STATS),
    "deliveries": ("created_at", DELIVERIES_FULL, DELIVERIES_STATS),
    "attempts": ("started_at", ATTEMPTS_FULL, ATTEMPTS_STATS),
}

_ARROW_TYPES: dict[type[DataType], pa.DataType] = {
    StringType: pa.string(), TimestampType: ARROW_TIMESTAMP, LongType: pa.int64(),
    DoubleType: pa.float64(), BooleanType: pa.bool_(), BinaryType: pa.binary(),
}


def arrow_type(kind: DataType) -> pa.DataType:
    if isinstance(kind, ArrayType):
        return pa.list_(arrow_type(kind.elementType))
    try:
        return _ARROW_TYPES[type(kind)]
    except KeyError:
        raise TypeError(f"no Arrow type for Spark type {kind.simpleString()}") from None


def arrow_schema(schema: StructType) -> pa.Schema:
    return pa.schema([pa.field(f.name, arrow_type(f.dataType), nullable=f.nullable)
                      for f in schema.fields])
