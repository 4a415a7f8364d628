"""Duplicate keys in bulk writes: expected (re-sends, races with upserts), unlike any other
write error."""

from __future__ import annotations

from pymongo.errors import BulkWriteError

from msgbus.errors import Unavailable

DUPLICATE_KEY = 11000


def raise_unless_duplicates(exc: BulkWriteError) -> None:
    """Duplicate keys are expected (re-sends, races with upserts); anything else is an error."""
    others = [e for e in exc.details.get("writeErrors", []) if e.get("code") != DUPLICATE_KEY]
    if others or exc.details.get("writeConcernErrors"):
        raise Unavailable(f"MongoDB bulk write failed: {others[:3]}") from exc
