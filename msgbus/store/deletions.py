"""`DeletionStore`: subscriptions and destinations an operator deleted whose broker resources
(Kafka consumer groups and topics, RabbitMQ queues and exchanges) are still to be removed.

The admin removes the configuration document at once (every service stops using it within a
registry refresh) and records a deletion here; a dispatcher removes the broker resources once
no live process pushes to what was deleted, then the deletion (`dispatcher/cleanup.py`). The
same name cannot be created again while its deletion is pending. Records and traces stay until
retention."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from msgbus.models import utcnow
from msgbus.store.mongo import MongoStore

SUBSCRIPTION = "subscription"
DESTINATION = "destination"


def deletion_id(kind: str, key: str) -> str:
    """`key`: a subscription id ("code/name") or a destination code."""
    return f"{kind}:{key}"


class DeletionStore:
    def __init__(self, store: MongoStore) -> None:
        self._deletions = store.db["deletions"]

    async def record(self, kind: str, destination: str, name: str | None, by: str) -> None:
        key = destination if name is None else f"{destination}/{name}"
        await self._deletions.replace_one(
            {"_id": deletion_id(kind, key)},
            {"kind": kind, "destination": destination, "name": name, "deleted_at": utcnow(),
             "by": by}, upsert=True)

    async def pending(self) -> list[dict[str, Any]]:
        return [d async for d in self._deletions.find({}).sort("deleted_at", 1)]

    async def is_pending(self, kind: str, key: str) -> bool:
        return await self._deletions.count_documents({"_id": deletion_id(kind, key)},
                                                     limit=1) > 0

    async def done(self, deletion: dict[str, Any], deleted_at: datetime) -> None:
        """Removes the deletion unless it was recorded again meanwhile."""
        await self._deletions.delete_one({"_id": deletion["_id"], "deleted_at": deleted_at})
