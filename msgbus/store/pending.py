"""`PendingSweep`: the compensator's pass over a subscription's pending batches (what the receiver
recorded it is to get). A message whose delivery has a state by now leaves its batch; one that has
none after the sweep threshold (its dispatcher died, its broker lost it, the direct path failed)
becomes a failed delivery, due now, for the retry loop.

Batches are read oldest first, and a pass stops at the first batch younger than the threshold
of which no message has a state yet: that is about where the subscription's dispatcher is, so a
pass costs what was delivered since the last one, also while a large backlog waits behind it.
Nothing here ever drops a message that has no state: a batch only loses messages whose delivery
state exists, and delivery states are never deleted (the archive keeps what retention removes).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from pymongo import ASCENDING
from pymongo.errors import BulkWriteError

from msgbus.models import DeliveryStatus, utcnow
from msgbus.store import documents as docs
from msgbus.store.idsets import find_by_ids
from msgbus.store.mongo import MongoStore, raise_unless_duplicates

log = logging.getLogger(__name__)

SWEPT_ERROR = "swept: no outcome was recorded in time"
_MESSAGE_FIELDS = {"destination": 1, "biz_id": 1, "created_at": 1}


@dataclass(slots=True)
class PendingPass:
    batches: int = 0  # batches read
    settled: int = 0  # messages found with a delivery state: removed from their batches
    swept: int = 0  # messages without one after the threshold: now failed and due
    reached_dispatcher: bool = False  # stopped at a young batch of which nothing is done


class PendingSweep:
    def __init__(self, store: MongoStore) -> None:
        self._store = store
        self._batches = store.pending_batches
        self._deliveries = store.deliveries
        self._messages = store.messages

    async def run(self, subscription: str, *, settle_before: datetime,
                  sweep_before: datetime | None, limit: int) -> PendingPass:
        """One page of up to `limit` batches of `subscription` recorded before `settle_before`,
        oldest first; those recorded before `sweep_before` (None: none) are emptied for
        good."""
        query = {"subscription": subscription, "recorded_at": {"$lt": settle_before}}
        cursor = self._batches.find(query).sort("recorded_at", ASCENDING).limit(limit)
        page = [b async for b in cursor]
        done = PendingPass()
        for batch in page:
            done.batches += 1
            ids: list[str] = batch["message_ids"]
            with_state = await self._store.with_state_among(subscription, ids)
            left = [m for m in ids if m not in with_state]
            done.settled += len(ids) - len(left)
            if left and sweep_before is not None and batch["recorded_at"] < sweep_before:
                done.swept += await self._fail_due_now(subscription, left)
                left = []
            if not left:
                await self._batches.delete_one({"_id": batch["_id"]})
            elif len(left) < len(ids):
                await self._batches.update_one({"_id": batch["_id"]},
                                               {"$set": {"message_ids": left, "n": len(left)}})
            else:
                done.reached_dispatcher = True
                break
        return done

    async def _fail_due_now(self, subscription: str, message_ids: list[str]) -> int:
        """Failed states, due now, for these messages; how many were new (a dispatcher's
        outcome may have landed meanwhile: it wins)."""
        now = utcnow()
        messages = await find_by_ids(self._messages, message_ids, projection=_MESSAGE_FIELDS)
        if len(messages) < len(message_ids):
            missing = len(message_ids) - len(messages)
            log.error("%s: %d pending messages have no record to push from", subscription,
                      missing)
        states = [docs.message_delivery_doc(m, subscription, now, DeliveryStatus.FAILED)
                  | {"next_attempt_at": now, "swept_at": now, "last_error": SWEPT_ERROR}
                  for m in messages]
        if not states:
            return 0
        try:
            await self._deliveries.insert_many(states, ordered=False)
        except BulkWriteError as exc:
            raise_unless_duplicates(exc)
            return int(exc.details.get("nInserted", 0))
        return len(states)

