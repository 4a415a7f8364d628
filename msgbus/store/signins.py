"""`SigninFailures`: the admin's failed sign-in counts (msgbus/throttle.py), in MongoDB so that
every admin replica counts the same failures (`signin_failures`; `_id` is "kind:key"). A count
goes by itself (a TTL index) once it is neither recent nor locked."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from pymongo import ASCENDING, IndexModel, ReturnDocument
from pymongo.asynchronous.database import AsyncDatabase

from msgbus.throttle import Failures

INDEXES = [IndexModel([("expires_at", ASCENDING)], expireAfterSeconds=0)]  # store/indexes.py
KEEP_S = 2 * 3600.0  # past a failure's window and any lock (at most 15 min by default)


def _at(epoch_s: float) -> datetime:
    return datetime.fromtimestamp(epoch_s, UTC)


def _failures(doc: dict[str, Any]) -> Failures:
    locked = doc.get("locked_until")
    return Failures(count=int(doc.get("count", 0)), last=doc["last"].timestamp(),
                    locked_until=locked.timestamp() if locked is not None else 0.0)


class SigninFailures:
    def __init__(self, db: AsyncDatabase[dict[str, Any]]) -> None:
        self._failures = db["signin_failures"]

    async def read(self, keys: list[str]) -> dict[str, Failures]:
        found = self._failures.find({"_id": {"$in": keys}})
        return {doc["_id"]: _failures(doc) async for doc in found}

    async def add(self, key: str, now: float, window_s: float) -> Failures:
        # a count whose last failure is out of the window starts again (two plain updates, not
        # one pipeline update: a race between replicas costs a failure's count, no more)
        await self._failures.update_one(
            {"_id": key, "last": {"$lt": _at(now - window_s)}}, {"$set": {"count": 0}})
        doc = await self._failures.find_one_and_update(
            {"_id": key}, {"$inc": {"count": 1},
                           "$set": {"last": _at(now), "expires_at": _at(now + KEEP_S)}},
            upsert=True, return_document=ReturnDocument.AFTER)
        assert doc is not None  # upserted
        return _failures(doc)

    async def lock(self, key: str, until: float) -> None:
        await self._failures.update_one({"_id": key}, {"$set": {
            "locked_until": _at(until), "expires_at": _at(until) + timedelta(seconds=KEEP_S)}})

    async def clear(self, keys: list[str]) -> None:
        await self._failures.delete_many({"_id": {"$in": keys}})

    async def locked(self, now: float) -> dict[str, Failures]:
        found = self._failures.find({"locked_until": {"$gt": _at(now)}}).sort("_id", ASCENDING)
        return {doc["_id"]: _failures(doc) async for doc in found}
