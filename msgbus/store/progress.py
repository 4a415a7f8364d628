"""`DeliveryProgress`: how far each subscription's deliveries are — which messages have an
outcome, what is still pending, its backlog — read from the delivery states and the pending
batches (`RecordStore` writes both)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

from pymongo import ASCENDING, DESCENDING
from pymongo.asynchronous.database import AsyncDatabase

from msgbus.models import UNDELIVERED_STATUSES, DeliveryStatus, delivery_id
from msgbus.store.idsets import find_by_ids
from msgbus.store.indexes import PENDING_BATCHES_INDEX, STATES_BY_AGE_INDEX
from msgbus.store.skipscan import subscriptions_matching


class DeliveryProgress:
    def __init__(self, db: AsyncDatabase[dict[str, Any]], *, walk: bool = True) -> None:
        self._walk = walk  # how scans across subscriptions go (msgbus/store/skipscan.py)
        self._deliveries = db["deliveries"]
        self._pending_batches = db["pending_batches"]

    async def handled_among(self, subscription: str, message_ids: Sequence[str]) -> set[str]:
        """Which of these messages MongoDB shows handled for `subscription`: delivered, or
        failed and with the compensator (or parked, skipped, discarded) — anything but pending
        or retried in place by a dispatcher."""
        if not message_ids:
            return set()
        ids = [delivery_id(m, subscription) for m in message_ids]
        query = {"status": {"$nin": [DeliveryStatus.PENDING.value,
                                     DeliveryStatus.RETRYING.value]}}
        found = await find_by_ids(self._deliveries, ids, query,
                                  {"message_id": 1, "status": 1, "next_attempt_at": 1})
        return {str(doc["message_id"]) for doc in found if not _held_in_place(doc)}

    async def with_state_among(self, subscription: str, message_ids: Sequence[str],
                               status: DeliveryStatus | None = None) -> set[str]:
        """Which of these messages have a delivery state for `subscription` (in `status`, when
        given): queries on _id."""
        if not message_ids:
            return set()
        ids = [delivery_id(m, subscription) for m in message_ids]
        query = None if status is None else {"status": status.value}
        found = await find_by_ids(self._deliveries, ids, query, {"message_id": 1})
        return {str(doc["message_id"]) for doc in found}

    async def deliveries_by_status(
        self, subscription: str, status: DeliveryStatus, limit: int = 100
    ) -> list[dict[str, Any]]:
        cursor = self._deliveries.find({"subscription": subscription, "status": status.value})
        return [d async for d in cursor.sort("created_at", ASCENDING).limit(limit)]

    async def count_deliveries(self, subscription: str, status: DeliveryStatus,
                               cap: int | None = None) -> int:
        """How many deliveries of `subscription` are in `status` (counted up to `cap`)."""
        query = {"subscription": subscription, "status": status.value}
        if cap is None:
            return await self._deliveries.count_documents(query)
        return await self._deliveries.count_documents(query, limit=cap)

    async def pending_message_ids(self, subscription: str, limit: int) -> list[str]:
        """Up to `limit` of the newest messages recorded for `subscription` that have no
        outcome yet, newest first."""
        ids: list[str] = []
        batches = self._pending_batches.find({"subscription": subscription},
                                             {"message_ids": 1})
        async for batch in batches.sort("recorded_at", DESCENDING):
            ids += reversed(batch["message_ids"])
            if len(ids) >= limit:
                break
        done = await self.with_state_among(subscription, ids)
        return [m for m in ids if m not in done][:limit]

    async def subscriptions_with_backlog(self, candidates: Collection[str]) -> set[str]:
        """Those of `candidates` with a pending batch or an undelivered state: those whose
        `backlog` may not be empty (msgbus/store/skipscan.py)."""
        batches = await subscriptions_matching(self._pending_batches, {}, PENDING_BATCHES_INDEX,
                                               candidates, walk=self._walk)
        states = await subscriptions_matching(
            self._deliveries, {"status": {"$in": [s.value for s in UNDELIVERED_STATUSES]}},
            STATES_BY_AGE_INDEX, set(candidates) - set(batches), walk=self._walk)
        return set(batches) | set(states)

    async def backlog(self, subscription: str, cap: int) -> tuple[int, datetime | None]:
        """Deliveries of a subscription not yet done (at most about `cap` counted) and the
        creation time of the oldest: the messages of its pending batches (those the last
        sweep has not seen an outcome of) and its undelivered states, each an index range."""
        count, oldest = 0, None
        batches = self._pending_batches.find({"subscription": subscription},
                                             {"n": 1, "oldest_created_at": 1})
        batches = batches.sort("recorded_at", ASCENDING)
        async for batch in batches:
            count += batch["n"]
            if oldest is None or batch["oldest_created_at"] < oldest:
                oldest = batch["oldest_created_at"]
            if count >= cap:
                break
        for status in UNDELIVERED_STATUSES:
            query = {"subscription": subscription, "status": status.value}
            count += await self._deliveries.count_documents(query, limit=cap)
            first = await self._deliveries.find_one(query, {"created_at": 1},
                                                    sort=[("created_at", ASCENDING)])
            if first is not None and (oldest is None or first["created_at"] < oldest):
                oldest = first["created_at"]
        return min(count, cap), oldest


def _held_in_place(delivery: dict[str, Any]) -> bool:
    """Scheduled, and held by an ordered subscription's dispatcher (no compensator takes it):
    a redelivered copy must be admitted again, or it would never be pushed."""
    return (delivery.get("status") == DeliveryStatus.SCHEDULED.value
            and delivery.get("next_attempt_at") is None)
