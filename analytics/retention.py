"""Retention of archived records: a TTL index on `archived_at` of messages, deliveries and
attempts. MongoDB's TTL monitor removes a record once its `archived_at` is older than the
retention; a record that was never archived has no `archived_at` and is never removed."""

from __future__ import annotations

from typing import Any

from pymongo.database import Database

from analytics.schemas import ARCHIVED_AT

ARCHIVED_COLLECTIONS = ("messages", "deliveries", "attempts")
TTL_INDEX_NAME = "archived_at_ttl"
_KEY = [(ARCHIVED_AT, 1)]


def ensure_retention(db: Database[Any], retention_s: int) -> None:
    """Create the TTL indexes, or change their expiry to `retention_s` (collMod: no rebuild)."""
    for collection in ARCHIVED_COLLECTIONS:
        current = _ttl_index(db, collection)
        if current is None:
            db[collection].create_index(_KEY, name=TTL_INDEX_NAME,
                                        expireAfterSeconds=retention_s)
        elif current.get("expireAfterSeconds") != retention_s:
            db.command("collMod", collection, index={
                "keyPattern": dict(_KEY), "expireAfterSeconds": retention_s})


def retention_s_of(db: Database[Any], collection: str) -> int | None:
    index = _ttl_index(db, collection)
    return None if index is None else index.get("expireAfterSeconds")


def _ttl_index(db: Database[Any], collection: str) -> dict[str, Any] | None:
    for index in db[collection].list_indexes():
        if list(index["key"].items()) == _KEY:
            return dict(index)
    return None
