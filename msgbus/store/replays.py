"""`ReplayStore`: replay jobs in MongoDB (`replays` collection) — their spec, state, progress,
the lease of the compensator running one, and their audit trail.

A job is run by one compensator at a time: it holds a lease on the job document, renewed with
every progress save; when that compensator dies, another takes the job over from its saved
position once the lease ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from pymongo import ASCENDING, DESCENDING

from msgbus.errors import Conflict
from msgbus.ids import uuid7
from msgbus.models import (
    DeliveryStatus,
    ReplayJob,
    ReplaySpec,
    ReplayState,
    delivery_id,
    utcnow,
)
from msgbus.store.checked import (
    Loaded,
    find_valid,
    read_each,
    read_valid,
    storable,
)
from msgbus.store.idsets import find_by_ids
from msgbus.store.mongo import MongoStore

COUNT_PAGE = 1000  # messages per read of a dry run that counts pending deliveries


def _checked_job(job: dict[str, Any]) -> dict[str, Any]:
    ReplayJob.model_validate(job)
    return job


def message_range_query(spec: ReplaySpec) -> dict[str, Any]:
    query: dict[str, Any] = {"destination": spec.destination,
                             "created_at": {"$gte": spec.since, "$lt": spec.until}}
    if spec.biz_id is not None:
        query["biz_id"] = spec.biz_id
    return query


class ReplayStore:
    def __init__(self, store: MongoStore) -> None:
        self._invalid_log = store.invalid_log
        self._jobs = store.db["replays"]
        self._messages = store.db["messages"]
        self._deliveries = store.db["deliveries"]

    async def ensure_indexes(self) -> None:
        await self._jobs.create_index([("state", ASCENDING), ("created_at", ASCENDING)])

    # --- planning ------------------------------------------------------------------------

    async def count_planned(self, spec: ReplaySpec, sub_ids: Sequence[str]) -> int:
        """The pushes a replay of `spec` to `sub_ids` makes (its dry run)."""
        if spec.statuses is None:
            return len(sub_ids) * await self._messages.count_documents(
                message_range_query(spec))
        if DeliveryStatus.PENDING in spec.statuses:
            # a pending delivery has no document of its own: count what the job will find
            return await self._count_by_state(spec, sub_ids)
        query: dict[str, Any] = {
            "subscription": {"$in": list(sub_ids)},
            "status": {"$in": [s.value for s in spec.statuses]},
            "created_at": {"$gte": spec.since, "$lt": spec.until}}
        if spec.biz_id is not None:
            query["biz_id"] = spec.biz_id
        return int(await self._deliveries.count_documents(query))

    async def _count_by_state(self, spec: ReplaySpec, sub_ids: Sequence[str]) -> int:
        wanted = set(spec.statuses or [])
        count, position = 0, None
        while page := await self.message_page(spec, position, COUNT_PAGE,
                                              projection={"subscriptions": 1}):
            states = await self.delivery_states(page, sub_ids)
            count += sum(1 for state in states.values() if state in wanted)
            position = {"created_at": page[-1]["created_at"], "_id": page[-1]["_id"]}
        return count

    async def create(self, spec: ReplaySpec, sub_ids: list[str], planned: int,
                     requested_by: str) -> dict[str, Any]:
        now = utcnow()
        job = storable({
            "_id": uuid7(), "spec": spec.model_dump(mode="python"), "subscriptions": sub_ids,
            "state": ReplayState.PLANNED.value, "planned": planned, "done": 0, "delivered": 0,
            "failed": 0, "position": None, "created_at": now, "updated_at": now,
            "requested_by": requested_by, "lease_owner": None, "lease_until": None,
            "audit": [{"at": now, "by": requested_by, "action": "created", "planned": planned}],
        }, ReplayJob.model_validate)
        await self._jobs.insert_one(job)
        return job

    async def get(self, job_id: str) -> dict[str, Any]:
        return await find_valid(self._jobs, job_id, "replay", "replay_id",
                                ReplayJob.model_validate, self._invalid_log)

    def _valid(self, job: dict[str, Any]) -> bool:
        return read_valid(job, "replays", ReplayJob.model_validate, self._invalid_log) is not None

    async def load_recent(self, limit: int) -> Loaded[dict[str, Any]]:
        """The newest `limit` jobs that validate, and those among them left out."""
        cursor = self._jobs.find({}).sort("created_at", DESCENDING).limit(limit)
        return read_each([j async for j in cursor], "replays", _checked_job,
                         self._invalid_log)

    async def recent(self, limit: int) -> list[dict[str, Any]]:
        return (await self.load_recent(limit)).items

    async def transition(self, job_id: str, allowed_from: Sequence[ReplayState],
                         to: ReplayState, by: str) -> dict[str, Any]:
        """Move a job to `to` if it is in one of `allowed_from`; audited."""
        job = await self.get(job_id)  # NotFound when it does not exist
        now = utcnow()
        fields: dict[str, Any] = {"state": to.value, "updated_at": now}
        if to is ReplayState.RUNNING:
            fields["started_at"] = now
        if to in (ReplayState.CANCELLED, ReplayState.DONE):
            fields["finished_at"] = now
        result = await self._jobs.update_one(
            {"_id": job_id, "state": {"$in": [s.value for s in allowed_from]}},
            {"$set": fields, "$push": {"audit": {"at": now, "by": by, "action": to.value,
                                                 "done": job["done"]}}})
        if result.matched_count == 0:
            job = await self.get(job_id)
            raise Conflict(f"replay {job_id} is {job['state']}; it cannot become {to.value} "
                           f"(only from {', '.join(s.value for s in allowed_from)})")
        return await self.get(job_id)

    # --- running (compensator) -----------------------------------------------------------

    async def claim_running(self, owner: str, lease_s: float) -> dict[str, Any] | None:
        """A running job nobody holds (or this owner already holds), leased to `owner`."""
        now = utcnow()
        free = {"state": ReplayState.RUNNING.value,
                "$or": [{"lease_until": None}, {"lease_until": {"$lt": now}},
                        {"lease_owner": owner}]}
        async for job in self._jobs.find(free).sort("created_at", ASCENDING):
            if not self._valid(job):
                continue  # reported; the jobs after it still run
            result = await self._jobs.update_one(
                {**free, "_id": job["_id"]},
                {"$set": {"lease_owner": owner,
                          "lease_until": now + timedelta(seconds=lease_s)}})
            if result.modified_count:
                return await self.get(job["_id"])
        return None

    async def save_progress(self, job_id: str, owner: str, lease_s: float, *,
                            position: dict[str, Any] | None, done: int, delivered: int,
                            failed: int) -> str | None:
        """Saves progress and renews the lease; returns the job's state now, or None when
        this owner no longer holds it."""
        now = utcnow()
        result = await self._jobs.update_one(
            {"_id": job_id, "lease_owner": owner},
            {"$set": {"position": position, "updated_at": now,
                      "lease_until": now + timedelta(seconds=lease_s)},
             "$inc": {"done": done, "delivered": delivered, "failed": failed}})
        if result.matched_count == 0:
            return None
        job = await self._jobs.find_one({"_id": job_id}, {"state": 1})
        return None if job is None else str(job["state"])

    async def release(self, job_id: str, owner: str) -> None:
        await self._jobs.update_one({"_id": job_id, "lease_owner": owner},
                                    {"$set": {"lease_owner": None, "lease_until": None}})

    async def finish(self, job_id: str, owner: str, done: int) -> None:
        now = utcnow()
        await self._jobs.update_one(
            {"_id": job_id, "lease_owner": owner, "state": ReplayState.RUNNING.value},
            {"$set": {"state": ReplayState.DONE.value, "finished_at": now, "updated_at": now,
                      "lease_owner": None, "lease_until": None},
             "$push": {"audit": {"at": now, "by": owner, "action": "done", "done": done}}})

    async def message_page(self, spec: ReplaySpec, position: dict[str, Any] | None,
                           limit: int, projection: dict[str, Any] | None = None
                           ) -> list[dict[str, Any]]:
        """The next messages of the range after `position` ({created_at, _id} of the last one
        done), in (created_at, _id) order; with `projection`, those fields and created_at."""
        query = message_range_query(spec)
        if position is not None:
            after: datetime = position["created_at"]
            query["$or"] = [{"created_at": {"$gt": after}},
                            {"created_at": after, "_id": {"$gt": position["_id"]}}]
        fields = None if projection is None else {**projection, "created_at": 1}
        cursor = self._messages.find(query, fields).sort([("created_at", ASCENDING),
                                                  ("_id", ASCENDING)]).limit(limit)
        return [m async for m in cursor]

    async def delivery_states(self, messages: Sequence[dict[str, Any]],
                              sub_ids: Sequence[str]) -> dict[str, DeliveryStatus]:
        """By delivery id: the state of each message (documents with their `subscriptions`)
        for each of `sub_ids`; pending where it was recorded for the subscription and has no
        outcome yet."""
        ids = [delivery_id(m["_id"], s) for m in messages for s in sub_ids]
        found = await find_by_ids(self._deliveries, ids, projection={"status": 1})
        states = {d["_id"]: DeliveryStatus(d["status"]) for d in found}
        for message in messages:
            for sub_id in set(message.get("subscriptions") or []) & set(sub_ids):
                states.setdefault(delivery_id(message["_id"], sub_id), DeliveryStatus.PENDING)
        return states
