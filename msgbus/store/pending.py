"""`PendingSweep`: the compensator's pass over a subscription's pending batches (what the receiver
recorded it is to get). A message whose delivery has a state by now leaves its batch; one that has
none after the sweep threshold (its dispatcher died, its broker lost it, the direct path failed)
becomes a failed delivery, due now, for the retry loop.

Batches are read oldest first, and a pass stops at the first batch younger than the threshold
of which no message has a state yet: that is about where the subscription's dispatcher is, so a
pass costs what was delivered since the last one, also while a large backlog waits behind it.
Nothing here ever drops a message that has no state: a batch only loses messages whose delivery
state exists, and delivery states are never deleted (the archive keeps what retention removes).

An ordered subscription's messages are swept one key at a time (`KeyOrder`): only a key's head,
the oldest message of its biz_id that is not delivered, parked or skipped; the key's later
messages stay in their batches until the head has an outcome, so the retries never push them
ahead of it.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pymongo import ASCENDING
from pymongo.errors import BulkWriteError

from msgbus.delivery.schedule import due_time
from msgbus.models import OPEN_STATUSES, DeliveryStatus, utcnow
from msgbus.store import documents as docs
from msgbus.store.duplicates import raise_unless_duplicates
from msgbus.store.idsets import find_by_ids
from msgbus.store.indexes import PENDING_BATCHES_INDEX
from msgbus.store.mongo import MongoStore
from msgbus.store.skipscan import subscriptions_matching

log = logging.getLogger(__name__)

SWEPT_ERROR = "swept: no outcome was recorded in time"
_MESSAGE_FIELDS = {"destination": 1, "biz_id": 1, "created_at": 1, "received_at": 1,
                   "deliver_at": 1}


_OPEN = [s.value for s in OPEN_STATUSES]


@dataclass(slots=True)
class KeyOrder:
    """One sweep of an ordered subscription: the keys it has met whose head is not done.

    Messages are taken in the order they were recorded (batches oldest first, each in its own
    order: the order the receiver accepted and published them), not by `created_at`, which
    messages accepted together share."""

    blocked: set[str] = field(default_factory=set)

    async def heads(self, deliveries: Any, subscription: str, messages: list[dict[str, Any]]
                    ) -> tuple[list[dict[str, Any]], list[str]]:
        """Of `messages` (no state yet, in recorded order), those that may be swept — each
        key's head, and every message without a biz_id — and the ids of the others, held
        back: a key that has a message in the retries or with the dispatcher (a state that is
        not final) sweeps nothing."""
        keys = {m["biz_id"] for m in messages if m.get("biz_id") is not None} - self.blocked
        self.blocked |= await self._with_open_deliveries(deliveries, subscription, keys)
        heads: list[dict[str, Any]] = []
        held: list[str] = []
        for message in messages:
            key = message.get("biz_id")
            if key is None:
                heads.append(message)
            elif key in self.blocked:
                held.append(message["_id"])
            else:
                heads.append(message)
                self.blocked.add(key)
        return heads, held

    @staticmethod
    async def _with_open_deliveries(deliveries: Any, subscription: str, keys: set[str]
                                    ) -> set[str]:
        if not keys:
            return set()
        cursor = deliveries.find(
            {"subscription": subscription, "status": {"$in": _OPEN},
             "biz_id": {"$in": sorted(keys)}}, {"biz_id": 1})
        return {doc["biz_id"] async for doc in cursor}


@dataclass(slots=True)
class PendingPass:
    batches: int = 0  # batches read
    settled: int = 0  # messages found with a delivery state: removed from their batches
    swept: int = 0  # messages without one after the threshold: now failed and due
    reached_dispatcher: bool = False  # stopped at a young batch of which nothing is done


class PendingSweep:
    def __init__(self, store: MongoStore) -> None:
        self._progress = store.progress
        self._batches = store.db["pending_batches"]
        self._walk = store.index_skip_scans
        self._deliveries = store.db["deliveries"]
        self._messages = store.db["messages"]

    async def subscriptions_with_batches(self, recorded_before: datetime,
                                         candidates: Collection[str]) -> list[str]:
        """Those of `candidates` with a pending batch recorded before `recorded_before`
        (msgbus/store/skipscan.py)."""
        return await subscriptions_matching(
            self._batches, {"recorded_at": {"$lt": recorded_before}}, PENDING_BATCHES_INDEX,
            candidates, walk=self._walk)

    async def run(self, subscription: str, *, settle_before: datetime,
                  sweep_before: datetime | None, limit: int,
                  order: KeyOrder | None = None, delay_s: float = 0.0) -> PendingPass:
        """One page of up to `limit` batches of `subscription` recorded before `settle_before`,
        oldest first; those recorded before `sweep_before` (None: none) are swept (of an
        ordered subscription, given its `order` for the whole sweep: the keys' heads). A swept
        message not yet due (its deliver_at, the subscription's `delay_s`) is scheduled."""
        query = {"subscription": subscription, "recorded_at": {"$lt": settle_before}}
        cursor = self._batches.find(query).sort("recorded_at", ASCENDING).limit(limit)
        page = [b async for b in cursor]
        done = PendingPass()
        for batch in page:
            done.batches += 1
            ids: list[str] = batch["message_ids"]
            with_state = await self._progress.with_state_among(subscription, ids)
            left = [m for m in ids if m not in with_state]
            done.settled += len(ids) - len(left)
            old = sweep_before is not None and batch["recorded_at"] < sweep_before
            if left and old:
                swept, left = await self._sweep(subscription, left, order, delay_s)
                done.swept += swept
            if not left:
                await self._batches.delete_one({"_id": batch["_id"]})
            elif len(left) < len(ids):
                await self._batches.update_one({"_id": batch["_id"]},
                                               {"$set": {"message_ids": left, "n": len(left)}})
            elif not old:
                done.reached_dispatcher = True
                break
        return done

    async def _sweep(self, subscription: str, message_ids: list[str],
                     order: KeyOrder | None, delay_s: float) -> tuple[int, list[str]]:
        """Sweeps these messages (of an ordered subscription, the keys' heads among them);
        returns how many it swept and the ids it held back."""
        found = await find_by_ids(self._messages, message_ids, projection=_MESSAGE_FIELDS)
        by_id = {m["_id"]: m for m in found}
        messages = [by_id[m] for m in message_ids if m in by_id]  # in recorded order
        if len(messages) < len(message_ids):
            missing = len(message_ids) - len(messages)
            log.error("%s: %d pending messages have no record to push from", subscription,
                      missing)
        held: list[str] = []
        if order is not None:
            messages, held = await order.heads(self._deliveries, subscription, messages)
        return await self._fail_due_now(subscription, messages, delay_s), held

    async def _fail_due_now(self, subscription: str, messages: list[dict[str, Any]],
                            delay_s: float) -> int:
        """Failed states, due now, for these messages (scheduled ones for those not due
        yet); how many were new (a dispatcher's outcome may have landed meanwhile: it wins)."""
        now = utcnow()
        states = [_swept_state(m, subscription, now, delay_s) for m in messages]
        if not states:
            return 0
        try:
            await self._deliveries.insert_many(states, ordered=False)
        except BulkWriteError as exc:
            raise_unless_duplicates(exc)
            return int(exc.details.get("nInserted", 0))
        return len(states)



def _swept_state(message: dict[str, Any], subscription: str, now: datetime,
                 delay_s: float) -> dict[str, Any]:
    """A swept message's state: failed and due now, or scheduled for its due time."""
    accepted_at = message.get("received_at") or message["created_at"]
    due = due_time(message.get("deliver_at"), accepted_at, delay_s)
    if due is not None and due > now:
        return docs.message_delivery_doc(message, subscription, now, DeliveryStatus.SCHEDULED) | {
            "next_attempt_at": due, "scheduled_for": due, "swept_at": now}
    return docs.message_delivery_doc(message, subscription, now, DeliveryStatus.FAILED) | {
        "next_attempt_at": now, "swept_at": now, "last_error": SWEPT_ERROR}
