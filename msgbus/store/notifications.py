"""`NotificationStore`: what teams were told (`notifications`, newest first per team) and, per
kind of event and subscription, when it was last told or seen (`notified`; `_id`
"kind|subscription"): the claim that makes one process, of many that saw the same event, tell
it once per cool-down, or only after a quiet period."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pymongo import DESCENDING, ReturnDocument
from pymongo.errors import DuplicateKeyError

from msgbus.ids import uuid7
from msgbus.models import utcnow
from msgbus.store.mongo import MongoStore


class NotificationStore:
    def __init__(self, store: MongoStore) -> None:
        self._told = store.db["notifications"]
        self._last = store.db["notified"]

    async def claim(self, kind: str, subscription: str, cooldown_s: float) -> bool:
        """True for the first claim of (kind, subscription) in `cooldown_s`: that caller
        tells it; every other one is quiet."""
        now = utcnow()
        try:
            await self._last.find_one_and_update(
                {"_id": f"{kind}|{subscription}",
                 "at": {"$lt": now - timedelta(seconds=cooldown_s)}},
                {"$set": {"at": now}}, upsert=True)
        except DuplicateKeyError:  # told within the cool-down: the filter missed, the id not
            return False
        return True

    async def first_after_quiet(self, kind: str, subscription: str, quiet_s: float) -> bool:
        """Marks (kind, subscription) seen now; True when it was not seen in the `quiet_s`
        before: the first of a run of events, told once however long the run lasts."""
        now = utcnow()
        try:
            before = await self._last.find_one_and_update(
                {"_id": f"{kind}|{subscription}"}, {"$set": {"seen": now}}, upsert=True,
                return_document=ReturnDocument.BEFORE)
        except DuplicateKeyError:  # another process's upsert came first: it tells
            return False
        seen = None if before is None else before.get("seen")
        return seen is None or seen < now - timedelta(seconds=quiet_s)

    async def record(self, team: str, kind: str, subscription: str, details: dict[str, Any],
                     outcome: str) -> None:
        await self._told.insert_one({
            "_id": uuid7(), "team": team, "kind": kind, "subscription": subscription,
            "at": utcnow(), "details": details, "outcome": outcome})

    async def recent(self, team: str, limit: int = 50) -> list[dict[str, Any]]:
        found = self._told.find({"team": team}, {"_id": 0}).sort("at", DESCENDING).limit(limit)
        return [doc async for doc in found]
