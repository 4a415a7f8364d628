"""`ShareStore`: who pushes to each subscription, and the share of its concurrency cap each one
holds, in MongoDB.

Collections:
- `instances`: one document per running dispatcher, compensator, admin (their cap shares'
  heartbeat) and receiver (a beacon, receiver/beacon.py: no shares, no circuits) (`_id` = its
  instance name), with `expires_at`, pushed forward by its heartbeat (one past it is dead) and
  `health_url`, where the admin's Services panel reads its /health.
- `cap_shares`: one document per subscription: `cap`, a `version` for compare-and-swap, and
  `entries`, one per instance pushing to it: `instance`, `component`, `held` (the slots it may
  have in use) and `demand` (the slots it would use). Each instance writes only its own entry
  (and drops the entries of dead instances); every write is a swap on `version`, so two
  instances never both take the same room.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from pymongo.errors import DuplicateKeyError

from msgbus.models import utcnow
from msgbus.store.mongo import MongoStore


class ShareStore:
    def __init__(self, store: MongoStore) -> None:
        self.gate = store.gate
        self._instances = store.db["instances"]
        self._shares = store.db["cap_shares"]

    async def beat(self, instance: str, component: str, lease_s: float,
                   details: dict[str, Any]) -> datetime:
        """This instance is alive for `lease_s` more; returns now."""
        now = utcnow()
        await self._instances.update_one(
            {"_id": instance},
            {"$set": {"component": component, "heartbeat_at": now,
                      "expires_at": now + timedelta(seconds=lease_s), **details},
             "$setOnInsert": {"started_at": now}},
            upsert=True)
        return now

    async def live_instances(self, now: datetime) -> dict[str, dict[str, Any]]:
        cursor = self._instances.find({"expires_at": {"$gt": now}})
        return {doc["_id"]: doc async for doc in cursor}

    async def recent_instances(self, now: datetime,
                               within_s: float) -> dict[str, dict[str, Any]]:
        """The live instances and those whose lease ended less than `within_s` ago (a process
        cut off from MongoDB cannot renew it, yet it still runs)."""
        since = now - timedelta(seconds=within_s)
        cursor = self._instances.find({"expires_at": {"$gt": since}},
                                      {"component": 1, "heartbeat_at": 1, "expires_at": 1,
                                       "started_at": 1, "health_url": 1})
        return {doc["_id"]: doc async for doc in cursor}

    async def leave(self, instance: str) -> None:
        """A clean stop: the instance is dead at once (its entries free their room)."""
        await self._instances.delete_one({"_id": instance})

    async def held_by(self, instance: str) -> list[str]:
        """The share documents with an entry of `instance`."""
        cursor = self._shares.find({"entries.instance": instance}, {"_id": 1})
        return [doc["_id"] async for doc in cursor]

    async def read(self, sub_ids: list[str]) -> dict[str, dict[str, Any]]:
        cursor = self._shares.find({"_id": {"$in": sub_ids}})
        return {doc["_id"]: doc async for doc in cursor}

    async def swap(self, sub_id: str, version: int, cap: int,
                   entries: list[dict[str, Any]]) -> bool:
        """Writes the subscription's entries if nobody wrote since `version` (0: none yet);
        False when somebody did."""
        doc = {"_id": sub_id, "version": version + 1, "cap": cap, "entries": entries,
               "updated_at": utcnow()}
        if version == 0:
            try:
                await self._shares.insert_one(doc)
                return True
            except DuplicateKeyError:
                return False
        result = await self._shares.replace_one({"_id": sub_id, "version": version}, doc)
        return result.matched_count == 1
