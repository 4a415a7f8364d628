"""`AnalyticsStore`: the analytics jobs' reads and writes of MongoDB (the `analytics` package), on
pymongo's synchronous API: they run in Spark's driver and tasks, not on an event loop.

- A time slice of a collection, with the filters Spark pushed down and the schema's projection
  (analytics/mongo_source.py: each slice is read by a Spark task of its own).
- What an archive run checks and marks (analytics/archive.py): the oldest message not archived
  yet, MongoDB's own counts of what Spark read, and `archived_at` set on what was written.
- Retention of archived records: a TTL index on `archived_at` of messages, deliveries and
  attempts. MongoDB's TTL monitor removes a record once its `archived_at` is older than the
  retention; a record that was never archived has no `archived_at` and is never removed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any

from pymongo import MongoClient

ARCHIVED_AT = "archived_at"
ARCHIVED_COLLECTIONS = ("messages", "deliveries", "attempts")
TTL_INDEX_NAME = "archived_at_ttl"
_TTL_KEY = [(ARCHIVED_AT, 1)]
MARK_CHUNK = 1000  # ids per update of an archive's marking


def slice_query(time_field: str, start: datetime, end: datetime,
                clauses: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The slice's range and the pushed clauses, merged per field where their operators
    differ: one condition per field keeps each slice's query a plain range on the time
    field's index, which no query planner mistakes for a collection scan (see
    docs/decisions.md, "The analytics source: one condition per field, one slice per
    core")."""
    merged: dict[str, Any] = {time_field: {"$gte": start, "$lt": end}}
    rest: list[dict[str, Any]] = []
    for clause in clauses:
        [(field, condition)] = clause.items()
        current = merged.get(field)
        if current is None:
            merged[field] = condition
        elif (isinstance(current, dict) and isinstance(condition, dict)
              and not current.keys() & condition.keys()):
            merged[field] = {**current, **condition}
        else:
            rest.append(clause)
    return {"$and": [merged, *rest]} if rest else merged


class AnalyticsStore:
    """A client of its own (`options`: pymongo's), closed on leaving a `with` block."""

    def __init__(self, uri: str, database: str, **options: Any) -> None:
        self._client: MongoClient[dict[str, Any]] = MongoClient(uri, **options)
        self._db = self._client[database]

    def __enter__(self) -> AnalyticsStore:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self._client.close()

    def read_slice(self, collection: str, query: dict[str, Any],
                   projection: dict[str, int] | None, batch_size: int
                   ) -> Iterator[dict[str, Any]]:
        """The documents of `collection` matching `query` (a `slice_query`), as the server
        hands them out, `batch_size` a round trip."""
        yield from self._db[collection].find(query, projection, batch_size=batch_size)

    # --- archiving -------------------------------------------------------------------------

    def oldest_unarchived_message(self, before: datetime) -> datetime | None:
        """The creation time of the oldest message created before `before` and not archived."""
        oldest = self._db["messages"].find_one(
            {"created_at": {"$lt": before}, ARCHIVED_AT: None}, {"created_at": 1},
            sort=[("created_at", 1)])
        return None if oldest is None else oldest["created_at"]

    def count_unarchived(self, start: datetime, before: datetime,
                         attempts_end: datetime) -> dict[str, int]:
        """By collection, the records not archived of an archive run's range: messages and
        deliveries created in [start, before), attempts started in [start, attempts_end)."""
        queries = {
            "messages": {"created_at": {"$gte": start, "$lt": before}, ARCHIVED_AT: None},
            "deliveries": {"created_at": {"$gte": start, "$lt": before}, ARCHIVED_AT: None},
            "attempts": {"started_at": {"$gte": start, "$lt": attempts_end},
                         ARCHIVED_AT: None},
        }
        return {name: self._db[name].count_documents(query) for name, query in queries.items()}

    def mark_archived(self, collection: str, ids: Iterable[str], marked_at: datetime) -> None:
        """Sets `archived_at` on these records, MARK_CHUNK ids an update."""
        target = self._db[collection]
        chunk: list[str] = []
        for doc_id in ids:
            chunk.append(doc_id)
            if len(chunk) >= MARK_CHUNK:
                target.update_many({"_id": {"$in": chunk}}, {"$set": {ARCHIVED_AT: marked_at}})
                chunk = []
        if chunk:
            target.update_many({"_id": {"$in": chunk}}, {"$set": {ARCHIVED_AT: marked_at}})

    # --- retention -------------------------------------------------------------------------

    def ensure_retention(self, retention_s: int) -> None:
        """Create the TTL indexes, or change their expiry to `retention_s` (collMod: no
        rebuild)."""
        for collection in ARCHIVED_COLLECTIONS:
            current = self._ttl_index(collection)
            if current is None:
                self._db[collection].create_index(_TTL_KEY, name=TTL_INDEX_NAME,
                                                  expireAfterSeconds=retention_s)
            elif current.get("expireAfterSeconds") != retention_s:
                self._db.command("collMod", collection, index={
                    "keyPattern": dict(_TTL_KEY), "expireAfterSeconds": retention_s})

    def retention_s_of(self, collection: str) -> int | None:
        index = self._ttl_index(collection)
        return None if index is None else index.get("expireAfterSeconds")

    def _ttl_index(self, collection: str) -> dict[str, Any] | None:
        for index in self._db[collection].list_indexes():
            if list(index["key"].items()) == _TTL_KEY:
                return dict(index)
        return None
