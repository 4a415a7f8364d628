"""`DrainStore`: which subscriptions drained which retired broker (`drains` collection: one
document per destination, retired broker and subscription; dispatcher/drains.py decides what
is drained and names each document)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pymongo.asynchronous.database import AsyncDatabase


class DrainStore:
    def __init__(self, db: AsyncDatabase[dict[str, Any]]) -> None:
        self._drains = db["drains"]

    async def recorded(self) -> list[dict[str, Any]]:
        """Every drain recorded so far."""
        return [d async for d in self._drains.find({})]

    async def record(self, drain_id: str, drain: dict[str, Any]) -> None:
        await self._drains.replace_one({"_id": drain_id}, drain, upsert=True)

    async def forget(self, drain_ids: Sequence[str]) -> None:
        await self._drains.delete_many({"_id": {"$in": list(drain_ids)}})
