"""`RecordStore`: what a message's way writes — the receiver's records (the messages and, per
subscription, a pending batch of them) and the outcomes of pushes (the attempts, and each
delivery's state).

Collections: messages (one per accepted message), pending_batches (one per record batch and
subscription: the messages the subscription is to get, until the compensator's sweep has seen
an outcome of each), attempts (append-only, one per push), deliveries (one per message and
subscription that has an outcome: the delivery state). Hot-path writes are batched:
insert_many and bulk_write, never one round trip per message.

No delivery document before the first outcome: a pending state per message and subscription
would cost every delivery an insert by the receiver and an update by its first outcome. One
pending batch per record batch and subscription lists what is to be delivered instead, and the
first outcome inserts the delivery's state (docs/decisions.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError

from msgbus.ids import uuid7
from msgbus.models import DeliveryOutcome, Envelope, utcnow
from msgbus.store import documents as docs
from msgbus.store import states
from msgbus.store.duplicates import raise_unless_duplicates
from msgbus.store.figures import FigureStore
from msgbus.store.gate import MongoGate

# a batch of records or outcomes: seconds on a busy server; a hang costs its drainer this once,
# and the gate then keeps every other call from waiting
BATCH_WRITE_TIMEOUT_S = 10.0
_DOCS_CHUNK = 64  # records turned into documents between two yields to the event loop


class RecordStore:
    def __init__(self, db: AsyncDatabase[dict[str, Any]], gate: MongoGate,
                 figures: FigureStore) -> None:
        self._messages = db["messages"]
        self._pending_batches = db["pending_batches"]
        self._attempts = db["attempts"]
        self._deliveries = db["deliveries"]
        self._gate = gate
        self._figures = figures

    # --- records (receiver) ----------------------------------------------------------------

    async def record_messages(self, records: Sequence[tuple[Envelope, list[str]]]) -> None:
        """Insert messages and, per subscription, one pending batch of them. Idempotent:
        re-inserting a message changes nothing; a batch re-written after a crash only makes
        the sweep look its messages up twice."""
        if not records:
            return
        async with self._gate.guard("records", BATCH_WRITE_TIMEOUT_S):
            await self._record_messages(records)

    async def _record_messages(self, records: Sequence[tuple[Envelope, list[str]]]) -> None:
        now = utcnow()
        messages: list[dict[str, Any]] = []
        by_subscription: dict[str, list[Envelope]] = {}
        # built in chunks, yielding between them: a batch of hundreds of records must not
        # stall the other work of the event loop (the receiver's requests)
        for start in range(0, len(records), _DOCS_CHUNK):
            if start:
                await asyncio.sleep(0)
            for envelope, subs in records[start : start + _DOCS_CHUNK]:
                messages.append(docs.message_doc(envelope, subs))
                for sub_id in subs:
                    by_subscription.setdefault(sub_id, []).append(envelope)
        try:
            await self._messages.insert_many(messages, ordered=False)
        except BulkWriteError as exc:
            raise_unless_duplicates(exc)
        # after the messages: a sweep that finds a batch finds its messages
        if by_subscription:
            await self._pending_batches.insert_many(
                [docs.pending_batch_doc(uuid7(), sub_id, envelopes, now)
                 for sub_id, envelopes in by_subscription.items()], ordered=False)

    # --- outcomes (dispatcher, compensator) ------------------------------------------------

    async def record_outcomes(self, outcomes: Sequence[DeliveryOutcome]) -> None:
        """Append the attempts, move each delivery's state forward, then add the pushes to
        the subscription's figures over time (`pushstats`, written within 2 s)."""
        if not outcomes:
            return
        async with self._gate.guard("outcomes", BATCH_WRITE_TIMEOUT_S):
            await self._record_attempts_and_states(outcomes)
        self._figures.add_pushes(o.result for o in outcomes if o.pushed)

    async def _record_attempts_and_states(self, outcomes: Sequence[DeliveryOutcome]) -> None:
        """Append the attempts and move each delivery's state forward.

        A delivered state is final: a later failed attempt (a duplicate push) never turns it
        back. Several outcomes of one delivery in a batch are folded into one write. A
        delivery's first outcome inserts its state; only the ones that exist already (retries,
        duplicates, sweeps) are updated, an update (find, then write) costing more than an
        insert.
        """
        attempts = [docs.attempt_doc(o.result) for o in outcomes if o.pushed]
        try:
            if attempts:
                await self._attempts.insert_many(attempts, ordered=False)
        except BulkWriteError as exc:
            raise_unless_duplicates(exc)
        groups = list(states.group_by_delivery(outcomes).values())
        # a first attempt's delivery has no state yet, as a rule; a retry's has one
        first = [g for g in groups if g[0].result.attempt <= 1]
        updates = [g for g in groups if g[0].result.attempt > 1]
        # a delivery scheduled again (a redelivery) keeps the state it has
        updates += [g for g in await self._insert_new_states(first)
                    if not states.only_scheduled(g)]
        if not updates:
            return
        try:
            await self._deliveries.bulk_write([states.state_update(g) for g in updates],
                                              ordered=False)
        except BulkWriteError as exc:
            raise_unless_duplicates(exc)  # duplicate key = already delivered: as intended

    async def _insert_new_states(self, groups: list[list[DeliveryOutcome]]
                                 ) -> list[list[DeliveryOutcome]]:
        """Inserts the groups' states; returns the groups whose delivery has one already."""
        if not groups:
            return []
        try:
            await self._deliveries.insert_many([states.new_state(g) for g in groups],
                                               ordered=False)
        except BulkWriteError as exc:
            raise_unless_duplicates(exc)
            return [groups[e["index"]] for e in exc.details.get("writeErrors", [])]
        return []
