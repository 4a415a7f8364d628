"""`msgbus analytics trace`: a message and its timeline (deliveries, each push) from the archive,
long after MongoDB's retention removed it."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analytics.errors import NotInArchive
from analytics.inputs import DATE_COLUMN, archive_path

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MAX_MESSAGES = 100  # a biz_id can have many messages: the most recent are shown


@dataclass(frozen=True)
class MessageTrace:
    message: dict[str, Any]
    deliveries: list[dict[str, Any]]
    attempts: list[dict[str, Any]]  # in the order they started


def find_traces(spark: SparkSession, archive_dir: Path, *, message_id: str | None = None,
                biz_id: str | None = None) -> list[MessageTrace]:
    from pyspark.sql import functions as F

    if (message_id is None) == (biz_id is None):
        raise ValueError("give exactly one of message_id and biz_id")
    messages = spark.read.parquet(archive_path(archive_dir, "messages"))
    if message_id is not None:
        messages = messages.where(F.col("_id") == F.lit(message_id))
        day = uuid7_date(message_id)
        if day is not None:  # partition pruning; a client's clock may be off by a day
            messages = messages.where(F.col(DATE_COLUMN).between(
                F.lit(day - timedelta(days=1)), F.lit(day + timedelta(days=1))))
    else:
        messages = messages.where(F.col("biz_id") == F.lit(biz_id))
    found = [row.asDict() for row in
             messages.orderBy(F.col("created_at").desc()).limit(MAX_MESSAGES).collect()]
    if not found:
        what = f"message_id {message_id}" if message_id is not None else f"biz_id {biz_id}"
        raise NotInArchive(f"no archived message with {what} in {archive_dir}")
    ids = [m["_id"] for m in found]
    days = sorted({m[DATE_COLUMN] for m in found})

    def related(table: str, order: str) -> dict[str, list[dict[str, Any]]]:
        frame = spark.read.parquet(archive_path(archive_dir, table)).where(
            F.col("message_id").isin(ids) & (F.col(DATE_COLUMN) >= F.lit(days[0])))
        grouped: dict[str, list[dict[str, Any]]] = {}
        for row in frame.orderBy(order, "_id").collect():
            grouped.setdefault(row["message_id"], []).append(row.asDict())
        return grouped

    deliveries, attempts = related("deliveries", "subscription"), related("attempts", "started_at")
    return [MessageTrace(m, deliveries.get(m["_id"], []), attempts.get(m["_id"], []))
            for m in found]


def uuid7_date(message_id: str) -> date | None:
    """The day a UUIDv7 message id was made (its first 48 bits: Unix milliseconds)."""
    try:
        parsed = uuid.UUID(message_id)
    except ValueError:
        return None
    if parsed.version != 7:
        return None
    return datetime.fromtimestamp((parsed.int >> 80) / 1000, UTC).date()


def format_trace(trace: MessageTrace) -> str:
    m = trace.message
    lines = [
        f"message {m['_id']}  destination {m['destination']}  biz_id {m.get('biz_id') or '-'}"
        f"  app {m.get('source_app') or '-'}  {m.get('size') or 0} bytes",
        f"  {_time(m.get('created_at'))}  created",
        f"  {_time(m.get('received_at'))}  accepted by the bus"
        f" (subscriptions: {', '.join(m.get('subscriptions') or []) or 'none'})",
    ]
    for a in trace.attempts:
        result = f"HTTP {a['status_code']}" if a.get("status_code") is not None else "no answer"
        error = f"  {a['error']}" if a.get("error") else ""
        lines.append(f"  {_time(a.get('started_at'))}  push #{a.get('attempt')} to "
                     f"{a['subscription']}: {result} in {a.get('latency_ms') or 0:.1f} ms"
                     f"{error}")
    for d in trace.deliveries:
        when = f" at {_time(d['delivered_at'])}" if d.get("delivered_at") else ""
        lines.append(f"  => {d['subscription']}: {d['status']}{when} after "
                     f"{d.get('attempts') or 0} attempt(s)")
    return "\n".join(lines)


def _time(moment: datetime | None) -> str:
    if moment is None:
        return "-" * 23
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
