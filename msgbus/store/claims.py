"""`DeliveryClaims`: the compensator's side of the delivery state — claiming due retries under
leases, sweeping deliveries left pending, parking and re-driving.

A claim is a lease: `next_attempt_at` moves to the lease's end and `lease` holds a token of the
claim. Nobody else claims the delivery until then; if the claimer dies, the delivery simply
becomes due again when the lease ends. Claiming is three indexed, batched round trips (find the
due ids in time windows (`DueScan`), update those still due, read back the ones this claim won),
never one `find_one_and_update` per delivery: a claim of hundreds of deliveries costs three
round trips, not hundreds (docs/decisions.md).
"""

from __future__ import annotations

import secrets
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pymongo import ASCENDING, UpdateOne

from msgbus.models import OPEN_STATUSES, DeliveryStatus, Envelope, utcnow
from msgbus.store import documents as docs
from msgbus.store.duescan import DueScan
from msgbus.store.idsets import find_by_ids, update_by_ids
from msgbus.store.indexes import CLAIMS_INDEX, STATES_BY_AGE_INDEX
from msgbus.store.mongo import MongoStore
from msgbus.store.pending import SWEPT_ERROR
from msgbus.store.skipscan import subscriptions_matching

_CLAIM_FIELDS = {"message_id": 1, "subscription": 1, "attempts": 1, "attempt_base": 1,
                 "redriven_at": 1, "scheduled_for": 1}
# what a claim takes: failed deliveries (retries) and scheduled ones (delayed, now due)
_CLAIMABLE = {"$in": [DeliveryStatus.FAILED.value, DeliveryStatus.SCHEDULED.value]}
# scheduled deliveries the compensator pushes when due (an ordered subscription's dispatcher
# holds its own, without a next_attempt_at)
_HELD_BY_CLAIMS = {"status": DeliveryStatus.SCHEDULED.value, "next_attempt_at": {"$ne": None}}
SCHEDULED_COUNT_CAP = 100_000
_COUNTED = [DeliveryStatus.FAILED.value, DeliveryStatus.PARKED.value,
            DeliveryStatus.SCHEDULED.value]  # by `stats`


@dataclass(slots=True)
class ClaimedDelivery:
    delivery_id: str
    message_id: str
    subscription: str
    attempts: int  # attempts made so far, by anyone
    attempt_base: int  # attempts before its last re-drive: the policy counts from there
    # its last re-drive, or its due time if it was delayed: the policy's max age counts from
    # there (None: from the message's creation)
    age_from: datetime | None
    lease_until: datetime

    @property
    def policy_attempts(self) -> int:
        """Attempts the retry policy counts once the next one is made."""
        return self.attempts + 1 - self.attempt_base


@dataclass(slots=True)
class SubscriptionRetryStats:
    due: int  # failed deliveries whose next attempt is due now (capped)
    waiting: int  # failed deliveries, due or not (capped)
    oldest_failed_at: datetime | None  # creation time of the oldest failed delivery
    parked: int
    scheduled: int  # waiting for their due time (capped at SCHEDULED_COUNT_CAP)


class DeliveryClaims:
    def __init__(self, store: MongoStore, owner: str) -> None:
        self._deliveries = store.db["deliveries"]
        self._messages = store.db["messages"]
        self._walk = store.index_skip_scans  # msgbus/store/skipscan.py
        self._due = DueScan(self._deliveries)
        self._due_scheduled = DueScan(self._deliveries, status=DeliveryStatus.SCHEDULED)
        self.owner = owner

    async def _due_ids(self, subscription: str, now: datetime, limit: int) -> list[str]:
        """Due failed and due scheduled deliveries, each oldest due first; when both fill the
        claim, each gets at least half of it."""
        failed = await self._due.due_ids(subscription, now, limit)
        scheduled = await self._due_scheduled.due_ids(
            subscription, now, limit - min(len(failed), limit // 2))
        # failed ones left out are found again by the next claim (the scan's floor only
        # moves over empty windows)
        return failed[:limit - len(scheduled)] + scheduled

    async def subscriptions_due(self, now: datetime, candidates: Collection[str], *,
                                after: str | None = None, limit: int) -> list[str]:
        """Up to `limit` subscriptions, in order, from the first after `after`, that have a
        failed or scheduled delivery due by `now`: the compensator's one scan per round
        (msgbus/store/skipscan.py; `candidates`: the ones to look at, without a walk)."""
        return await subscriptions_matching(
            self._deliveries, {"status": _CLAIMABLE, "next_attempt_at": {"$lte": now}},
            CLAIMS_INDEX, candidates, walk=self._walk, after=after, limit=limit)

    async def claim_due(self, subscription: str, limit: int,
                        lease_s: float) -> list[ClaimedDelivery]:
        """Up to `limit` failed or scheduled deliveries of `subscription` whose next attempt
        is due, oldest due first, leased to this owner for `lease_s`."""
        now = utcnow()
        ids = await self._due_ids(subscription, now, limit)
        if not ids:
            return []
        token = f"{self.owner}:{secrets.token_hex(8)}"
        lease_until = now + timedelta(seconds=lease_s)
        # by _id only (and the due condition again, against a race): the _id index finds
        # exactly these documents, with no other index for a planner to choose
        # (docs/decisions.md)
        claimed = await update_by_ids(
            self._deliveries, ids,
            {"status": _CLAIMABLE, "next_attempt_at": {"$lte": now}},
            {"$set": {"next_attempt_at": lease_until, "lease": token}})
        # all modified: this claim won them all, and the ids' documents are what it needs
        # (when another claim won some, only the ones holding this token are ours)
        won = await find_by_ids(self._deliveries, ids,
                                {} if claimed == len(ids) else {"lease": token}, _CLAIM_FIELDS)
        return [ClaimedDelivery(
            delivery_id=d["_id"], message_id=d["message_id"], subscription=d["subscription"],
            attempts=d.get("attempts", 0), attempt_base=d.get("attempt_base", 0),
            age_from=d.get("redriven_at") or d.get("scheduled_for"), lease_until=lease_until)
            for d in won]

    async def release(self, claimed: list[ClaimedDelivery], delay_s: float) -> None:
        """Give claimed deliveries back unattempted: due again after `delay_s`."""
        if not claimed:
            return
        await update_by_ids(
            self._deliveries, [c.delivery_id for c in claimed], {"status": _CLAIMABLE},
            {"$set": {"next_attempt_at": utcnow() + timedelta(seconds=delay_s)}})

    async def envelopes(self, message_ids: list[str]) -> dict[str, Envelope]:
        found = await find_by_ids(self._messages, message_ids)
        return {d["_id"]: docs.envelope_from_doc(d) for d in found}

    async def subscriptions_with_pending(self, older_than: datetime,
                                         candidates: Collection[str]) -> list[str]:
        """Those of `candidates` with a pending delivery state created before `older_than`
        (what `sweep_pending` turns into retries)."""
        return await subscriptions_matching(
            self._deliveries, {"status": DeliveryStatus.PENDING.value,
                               "created_at": {"$lt": older_than}}, STATES_BY_AGE_INDEX,
            candidates, walk=self._walk)

    async def subscriptions_with_open(self, candidates: Collection[str]) -> list[str]:
        """Those of `candidates` with a failed, parked or scheduled delivery: those whose
        retry gauges `stats` counts (every other one's are zero)."""
        return await subscriptions_matching(
            self._deliveries, {"status": {"$in": _COUNTED}}, STATES_BY_AGE_INDEX, candidates,
            walk=self._walk)

    async def sweep_pending(self, subscription: str, older_than: datetime,
                            limit: int) -> int:
        """Pending delivery states of `subscription` (as versions before the pending batches
        wrote them) created before `older_than` become failed and due now, for the retry loop.
        Returns how many."""
        stale = {"subscription": subscription, "status": DeliveryStatus.PENDING.value,
                 "created_at": {"$lt": older_than}}
        cursor = self._deliveries.find(stale, {"_id": 1}).sort("created_at", ASCENDING)
        ids = [d["_id"] async for d in cursor.limit(limit)]
        if not ids:
            return 0
        now = utcnow()
        return await update_by_ids(
            self._deliveries, ids, {"status": DeliveryStatus.PENDING.value},
            {"$set": {"status": DeliveryStatus.FAILED.value, "next_attempt_at": now,
                      "swept_at": now, "updated_at": now,
                      "last_error": SWEPT_ERROR}})

    async def scheduled(self, subscription: str, limit: int) -> list[dict[str, Any]]:
        """Scheduled deliveries of `subscription`, soonest due first (those an ordered
        subscription's dispatcher holds in place come first: they have no due time here)."""
        cursor = self._deliveries.find(
            {"subscription": subscription, "status": DeliveryStatus.SCHEDULED.value})
        return [d async for d in cursor.sort("next_attempt_at", ASCENDING).limit(limit)]

    async def deliver_scheduled_now(self, subscription: str, message_ids: list[str]) -> int:
        """These scheduled deliveries become due now. Only those the compensator holds: an
        ordered subscription's dispatcher keeps its own in its key's lane. Returns how many."""
        now = utcnow()
        return await update_by_ids(
            self._deliveries, [f"{m}|{subscription}" for m in message_ids], _HELD_BY_CLAIMS,
            {"$set": {"next_attempt_at": now, "delivered_now_at": now, "updated_at": now}})

    async def cancel_scheduled(self, subscription: str, message_ids: list[str],
                               reason: str) -> int:
        """These scheduled deliveries are dropped before their time: `discarded`, with the
        operator's reason. Returns how many."""
        now = utcnow()
        return await update_by_ids(
            self._deliveries, [f"{m}|{subscription}" for m in message_ids], _HELD_BY_CLAIMS,
            {"$set": {"status": DeliveryStatus.DISCARDED.value, "next_attempt_at": None,
                      "discarded_at": now, "discard_reason": reason, "updated_at": now}})

    async def stats(self, subscription: str, cap: int) -> SubscriptionRetryStats:
        failed = {"subscription": subscription, "status": DeliveryStatus.FAILED.value}
        due = await self._deliveries.count_documents(
            {**failed, "next_attempt_at": {"$lte": utcnow()}}, limit=cap)
        waiting = await self._deliveries.count_documents(failed, limit=cap)
        oldest = await self._deliveries.find_one(failed, {"created_at": 1},
                                                 sort=[("created_at", ASCENDING)])
        parked = await self._deliveries.count_documents(
            {"subscription": subscription, "status": DeliveryStatus.PARKED.value}, limit=cap)
        # an index range as long as what waits: counted only up to a smaller cap
        scheduled = await self._deliveries.count_documents(
            {"subscription": subscription, "status": DeliveryStatus.SCHEDULED.value},
            limit=min(cap, SCHEDULED_COUNT_CAP))
        return SubscriptionRetryStats(
            due=due, waiting=waiting, parked=parked, scheduled=scheduled,
            oldest_failed_at=oldest["created_at"] if oldest else None)

    async def parked(self, subscription: str, limit: int) -> list[dict[str, Any]]:
        cursor = self._deliveries.find(
            {"subscription": subscription, "status": DeliveryStatus.PARKED.value})
        return [d async for d in cursor.sort("created_at", ASCENDING).limit(limit)]

    async def redrive(self, subscription: str, message_ids: list[str] | None = None,
                      *, batch: int = 500) -> int:
        """Parked deliveries of `subscription` (all, or those of `message_ids`) become due now,
        with the policy's attempt count and age starting afresh. Returns how many."""
        query: dict[str, Any] = {"subscription": subscription,
                                 "status": DeliveryStatus.PARKED.value}
        if message_ids is not None:
            query["_id"] = {"$in": [f"{m}|{subscription}" for m in message_ids]}
        total = 0
        while True:
            page = [d async for d in self._deliveries.find(query, {"attempts": 1}).limit(batch)]
            if not page:
                return total
            now = utcnow()
            ops = [UpdateOne({"_id": d["_id"], "status": DeliveryStatus.PARKED.value},
                             {"$set": {"status": DeliveryStatus.FAILED.value,
                                       "next_attempt_at": now, "redriven_at": now,
                                       "updated_at": now,
                                       "attempt_base": d.get("attempts", 0)}})
                   for d in page]
            result = await self._deliveries.bulk_write(ops, ordered=False)
            total += result.modified_count
            if len(page) < batch:
                return total

    async def skip_open(self, subscription: str, reason: str) -> int:
        """Every open state of `subscription` (pending, failed, retrying, scheduled) becomes
        `skipped` with the operator's reason (an operator skipped its backlog). Returns how
        many."""
        now = utcnow()
        result = await self._deliveries.update_many(
            {"subscription": subscription,
             "status": {"$in": [s.value for s in OPEN_STATUSES]}},
            {"$set": {"status": DeliveryStatus.SKIPPED.value, "last_error": reason,
                      "next_attempt_at": None, "skipped_at": now, "updated_at": now}})
        return int(result.modified_count)

    async def discard(self, subscription: str, message_ids: list[str] | None,
                      reason: str) -> int:
        """Parked deliveries of `subscription` (all, or those of `message_ids`) are dropped
        for good: status `discarded`, with the reason. Returns how many."""
        query: dict[str, Any] = {"subscription": subscription,
                                 "status": DeliveryStatus.PARKED.value}
        if message_ids is not None:
            query["_id"] = {"$in": [f"{m}|{subscription}" for m in message_ids]}
        now = utcnow()
        result = await self._deliveries.update_many(query, {"$set": {
            "status": DeliveryStatus.DISCARDED.value, "discarded_at": now,
            "discard_reason": reason, "updated_at": now}})
        return int(result.modified_count)
