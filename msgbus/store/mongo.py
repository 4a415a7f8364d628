"""`MongoStore`: every MongoDB read and write of the bus, on pymongo's native async API.

Collections: messages (one per accepted message), deliveries (one per message and subscription
that has an outcome: the delivery state), pending_batches (one per record batch and subscription:
the messages the subscription is to get, until the compensator's sweep has seen an outcome of
each), attempts (append-only, one per push), destinations, subscriptions, apps, runtime (one
document: the knobs operators change at runtime), schemas (payload schema versions,
msgbus/store/schemas.py).
Hot-path writes are batched: insert_many and bulk_write, never one round trip per message.

No delivery document before the first outcome: a pending state per message and subscription
would cost every delivery an insert by the receiver and an update by its first outcome. One
pending batch per record batch and subscription lists what is to be delivered instead, and the
first outcome inserts the delivery's state (docs/decisions.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from pymongo import ASCENDING, DESCENDING, AsyncMongoClient, IndexModel, UpdateOne
from pymongo.errors import BulkWriteError, DuplicateKeyError, PyMongoError

from msgbus.errors import Conflict, MongoUnavailable, NotFound, Unavailable
from msgbus.ids import uuid7
from msgbus.models import (
    UNDELIVERED_STATUSES,
    DeliveryOutcome,
    DeliveryStatus,
    Destination,
    Envelope,
    ProducerApp,
    RuntimeConfig,
    Subscription,
    delivery_id,
    utcnow,
)
from msgbus.store import documents as docs
from msgbus.store import pushstats
from msgbus.store.checked import (
    InvalidDocument,
    InvalidDocumentLog,
    Loaded,
    read_each,
    read_one,
    read_valid,
    storable,
)
from msgbus.store.gate import MongoGate
from msgbus.store.idsets import find_by_ids

log = logging.getLogger(__name__)

_DUPLICATE_KEY = 11000
MAX_INVALID_LISTED = 1000
# a batch of records or outcomes: seconds on a busy server; a hang costs its drainer this once,
# and the gate then keeps every other call from waiting
BATCH_WRITE_TIMEOUT_S = 10.0
PUSH_FIGURES_TIMEOUT_S = 5.0
LOOKUP_TIMEOUT_S = 2.0  # a look-up a request waits for (an API key)
_DOCS_CHUNK = 64  # records turned into documents between two yields to the event loop

INDEXES: dict[str, list[IndexModel]] = {
    "messages": [
        IndexModel([("biz_id", ASCENDING), ("created_at", DESCENDING)]),
        IndexModel([("destination", ASCENDING), ("created_at", DESCENDING)]),
        IndexModel([("created_at", DESCENDING)]),
    ],
    "deliveries": [
        # a message's trace: an equality on message_id (docs/decisions.md: why not a range
        # of the _ids, which begin with the message id)
        IndexModel([("message_id", ASCENDING)]),
        IndexModel([("subscription", ASCENDING), ("status", ASCENDING), ("created_at", ASCENDING)]),
        # the compensator's claims: one subscription's failed deliveries by due time
        IndexModel([("subscription", ASCENDING), ("status", ASCENDING),
                    ("next_attempt_at", ASCENDING)]),
        # analytics: reads by time range (statistics, archive), split into parallel slices
        IndexModel([("created_at", ASCENDING)]),
    ],
    # the sweep: one subscription's batches, oldest first
    "pending_batches": [IndexModel([("subscription", ASCENDING), ("recorded_at", ASCENDING)])],
    "attempts": [
        IndexModel([("message_id", ASCENDING), ("started_at", ASCENDING)]),
        IndexModel([("started_at", ASCENDING)]),  # analytics: reads by time range
        # the admin dashboard's push latency and success rate of one subscription's last hour
        IndexModel([("subscription", ASCENDING), ("started_at", DESCENDING)]),
    ],
    "subscriptions": [IndexModel([("destination", ASCENDING)])],
    "schemas": [IndexModel([("destination", ASCENDING), ("version", ASCENDING)])],
    "apps": [IndexModel([("key_hashes", ASCENDING)])],
    "instances": [IndexModel([("expires_at", ASCENDING)])],  # the live ones (cap shares)
    "push_stats": pushstats.INDEXES,
}
# Indexes earlier versions created that no query uses any more: dropped by `ensure_indexes`,
# since every index costs a write per document written to its collection (docs/decisions.md).
OBSOLETE_INDEXES: dict[str, list[str]] = {"deliveries": ["status_1_next_attempt_at_1"]}


def raise_unless_duplicates(exc: BulkWriteError) -> None:
    """Duplicate keys are expected (re-sends, races with upserts); anything else is an error."""
    others = [e for e in exc.details.get("writeErrors", []) if e.get("code") != _DUPLICATE_KEY]
    if others or exc.details.get("writeConcernErrors"):
        raise Unavailable(f"MongoDB bulk write failed: {others[:3]}") from exc


class MongoStore:
    def __init__(self, uri: str, db_name: str, *, timeout_ms: int = 5000,
                 socket_timeout_ms: int = 30_000, component: str = "msgbus") -> None:
        """`component`: which service this process runs (its gate's metric label)."""
        # socket_timeout_ms: a server that stops answering (hung, or a half-open connection
        # after a restart) fails the call instead of holding its caller forever (pymongo's
        # default is no timeout); the drainers then back off and try again. Well above the
        # longest legitimate call (a sweep's update_many, a dashboard aggregation: seconds).
        # journal=True: a write is acknowledged once it is in the server's journal. The bus
        # deletes its local copy of a record or outcome on that acknowledgement, and an
        # acknowledged write that was not journaled is lost when the server crashes (up to the
        # journal's commit interval on MongoDB; every write since the last checkpoint on the
        # development stand-in). docs/decisions.md, "Journaled writes".
        self._client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
            uri, serverSelectionTimeoutMS=timeout_ms, socketTimeoutMS=socket_timeout_ms,
            tz_aware=True, appname="msgbus", journal=True
        )
        self.db = self._client[db_name]
        self.messages = self.db["messages"]
        self.deliveries = self.db["deliveries"]
        self.pending_batches = self.db["pending_batches"]
        self.attempts = self.db["attempts"]
        self.destinations = self.db["destinations"]
        self.subscriptions = self.db["subscriptions"]
        self.apps = self.db["apps"]
        self.runtime = self.db["runtime"]
        self.push_stats = self.db["push_stats"]
        # every call on a message's way goes through it: an outage costs one timeout
        self.gate = MongoGate(lambda: self._client.admin.command("ping"), component=component)
        self.push_figures = pushstats.PushStatsBuffer(self._upsert_push_stats, self.gate)
        self.invalid_log = InvalidDocumentLog()  # stored documents that do not validate

    async def ensure_indexes(self) -> None:
        # obsolete ones first: MongoDB refuses a second index on the same keys
        for collection, names in OBSOLETE_INDEXES.items():
            existing = await self.db[collection].index_information()
            for name in names:
                if name in existing:
                    await self.db[collection].drop_index(name)
        for collection, indexes in INDEXES.items():
            await self.db[collection].create_indexes(indexes)

    async def ping(self, timeout_s: float = 1.0) -> bool:
        """Whether MongoDB answers within `timeout_s`; False at once while the gate is closed
        (health checks answer fast during an outage; the gate's probe looks for the return)."""
        try:
            async with self.gate.guard("ping", timeout_s):
                await self._client.admin.command("ping")
            return True
        except (MongoUnavailable, PyMongoError):
            return False

    async def close(self) -> None:
        await self.gate.close()
        await self.push_figures.close()
        await self._client.close()

    # --- configuration -------------------------------------------------------------------

    async def save_destination(self, destination: Destination) -> None:
        doc = storable(docs.destination_doc(destination), docs.destination_from_doc)
        await self.destinations.replace_one({"_id": doc["_id"]}, doc, upsert=True)

    async def get_destination(self, code: str) -> Destination:
        doc = await self.destinations.find_one({"_id": code})
        if doc is None:
            raise NotFound(f"unknown destination {code!r}", field="destination")
        return read_one(doc, "destinations", docs.destination_from_doc, self.invalid_log)

    async def load_destinations(self) -> Loaded[Destination]:
        """Every destination that validates, and those left out (reported)."""
        found = [d async for d in self.destinations.find().sort("_id", ASCENDING)]
        loaded = read_each(found, "destinations", docs.destination_from_doc, self.invalid_log)
        self.invalid_log.whole_collection("destinations", loaded.invalid)
        return loaded

    async def list_destinations(self) -> list[Destination]:
        return (await self.load_destinations()).items

    async def save_subscription(self, subscription: Subscription) -> None:
        doc = storable(docs.subscription_doc(subscription), docs.subscription_from_doc)
        await self.subscriptions.replace_one({"_id": doc["_id"]}, doc, upsert=True)

    async def load_subscriptions(self, destination: str | None = None) -> Loaded[Subscription]:
        """The subscriptions (of `destination`, or all) that validate, and those left out."""
        query = {} if destination is None else {"destination": destination}
        found = [d async for d in self.subscriptions.find(query).sort("_id", ASCENDING)]
        loaded = read_each(found, "subscriptions", docs.subscription_from_doc,
                           self.invalid_log)
        if destination is None:
            self.invalid_log.whole_collection("subscriptions", loaded.invalid)
        return loaded

    async def list_subscriptions(self, destination: str | None = None) -> list[Subscription]:
        return (await self.load_subscriptions(destination)).items

    async def get_subscription(self, sub_id: str) -> Subscription:
        doc = await self.subscriptions.find_one({"_id": sub_id})
        if doc is None:
            raise NotFound(f"unknown subscription {sub_id!r}", field="subscription")
        return read_one(doc, "subscriptions", docs.subscription_from_doc, self.invalid_log)

    async def get_runtime(self) -> RuntimeConfig:
        """The runtime knobs; the defaults while none are stored or what is stored does not
        validate (reported)."""
        doc = await self.runtime.find_one({"_id": docs.RUNTIME_ID})
        loaded = read_each([doc] if doc else [], "runtime", docs.runtime_from_doc,
                           self.invalid_log)
        self.invalid_log.whole_collection("runtime", loaded.invalid)
        return loaded.items[0] if loaded.items else RuntimeConfig()

    async def save_runtime(self, config: RuntimeConfig) -> None:
        doc = storable(docs.runtime_doc(config), docs.runtime_from_doc)
        await self.runtime.replace_one({"_id": docs.RUNTIME_ID}, doc, upsert=True)

    # --- documents that do not validate --------------------------------------------------

    async def invalid_documents(self, collection: str,
                                limit: int = MAX_INVALID_LISTED) -> list[InvalidDocument]:
        """The documents of a configuration collection that do not validate (its newest
        `limit` documents are checked: configuration collections are small, replays grow)."""
        parse = docs.CONFIG_PARSERS[collection]
        cursor = self.db[collection].find().sort("_id", DESCENDING).limit(limit)
        loaded = read_each([d async for d in cursor], collection, parse, self.invalid_log)
        return loaded.invalid

    async def all_invalid_documents(self) -> list[InvalidDocument]:
        """Those of every configuration collection."""
        return [found for collection in docs.CONFIG_PARSERS
                for found in await self.invalid_documents(collection)]

    async def delete_invalid_document(self, collection: str, doc_id: str) -> None:
        """Deletes a document that does not validate; one that does is refused (409): it is
        changed or deleted through its own API, which audits and cleans up after it."""
        doc = await self.db[collection].find_one({"_id": doc_id})
        if doc is None:
            raise NotFound(f"no {collection} document {doc_id!r}", field="id")
        if read_valid(doc, collection, docs.CONFIG_PARSERS[collection],
                      self.invalid_log) is not None:
            raise Conflict(f"the {collection} document {doc_id!r} is valid: change or delete "
                           "it through its own API", field="id")
        await self.db[collection].delete_one({"_id": doc_id})

    # --- producer apps -------------------------------------------------------------------

    async def create_app(self, name: str, key_hash: str, destinations: Sequence[str]) -> None:
        doc = storable({"_id": name, "key_hashes": [key_hash],
                        "destinations": list(destinations), "created_at": utcnow()},
                       ProducerApp.model_validate)
        try:
            await self.apps.insert_one(doc)
        except DuplicateKeyError as exc:
            existing = await self.apps.find_one({"_id": name})
            if existing is None or read_valid(existing, "apps", ProducerApp.model_validate,
                                              self.invalid_log) is not None:
                raise Conflict(f"producer app {name!r} already exists", field="name") from exc
            await self.apps.replace_one({"_id": name}, doc)  # it did not validate

    async def replace_app_keys(self, name: str, key_hash: str,
                               destinations: Sequence[str]) -> None:
        """Create the app, or revoke all its keys and give it this one (also the way to
        replace an app whose stored document does not validate)."""
        existing = await self.apps.find_one({"_id": name}, {"created_at": 1})
        created_at = (existing or {}).get("created_at")
        doc = storable({"_id": name, "key_hashes": [key_hash],
                        "destinations": list(destinations),
                        "created_at": created_at if isinstance(created_at, datetime)
                        else utcnow()}, ProducerApp.model_validate)
        await self.apps.replace_one({"_id": name}, doc, upsert=True)

    async def load_apps(self) -> Loaded[ProducerApp]:
        found = [a async for a in self.apps.find({}).sort("_id", ASCENDING)]
        loaded = read_each(found, "apps", ProducerApp.model_validate, self.invalid_log)
        self.invalid_log.whole_collection("apps", loaded.invalid)
        return loaded

    async def _app(self, name: str) -> ProducerApp:
        doc = await self.apps.find_one({"_id": name})
        if doc is None:
            raise NotFound(f"unknown producer app {name!r}", field="name")
        return read_one(doc, "apps", ProducerApp.model_validate, self.invalid_log)

    async def add_app_key(self, name: str, key_hash: str) -> None:
        """Another key for the app (the old ones keep working until revoked)."""
        await self._app(name)  # an app that does not validate is replaced, not extended
        await self.apps.update_one({"_id": name}, {
            "$push": {"key_hashes": key_hash}, "$set": {"revoked_at": None}})

    async def revoke_app_keys(self, name: str) -> None:
        """Every key of the app stops working (receivers notice within their key cache's
        lifetime, 30 s). Works on an app whose document does not validate, too."""
        result = await self.apps.update_one({"_id": name}, {
            "$set": {"key_hashes": [], "revoked_at": utcnow()}})
        if result.matched_count == 0:
            raise NotFound(f"unknown producer app {name!r}", field="name")

    async def find_app_by_key_hash(self, key_hash: str) -> ProducerApp | None:
        """The app holding this key; None also when its document does not validate (its keys
        do not work until it is fixed: reported, never guessed at)."""
        async with self.gate.guard("API key lookup", LOOKUP_TIMEOUT_S):
            doc = await self.apps.find_one({"key_hashes": key_hash})
        if doc is None:
            return None
        return read_valid(doc, "apps", ProducerApp.model_validate, self.invalid_log)

    # --- records (receiver) --------------------------------------------------------------

    async def record_messages(self, records: Sequence[tuple[Envelope, list[str]]]) -> None:
        """Insert messages and, per subscription, one pending batch of them. Idempotent:
        re-inserting a message changes nothing; a batch re-written after a crash only makes
        the sweep look its messages up twice."""
        if not records:
            return
        async with self.gate.guard("records", BATCH_WRITE_TIMEOUT_S):
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
            await self.messages.insert_many(messages, ordered=False)
        except BulkWriteError as exc:
            raise_unless_duplicates(exc)
        # after the messages: a sweep that finds a batch finds its messages
        if by_subscription:
            await self.pending_batches.insert_many(
                [docs.pending_batch_doc(uuid7(), sub_id, envelopes, now)
                 for sub_id, envelopes in by_subscription.items()], ordered=False)

    # --- outcomes (dispatcher, compensator) ----------------------------------------------

    async def record_outcomes(self, outcomes: Sequence[DeliveryOutcome]) -> None:
        """Append the attempts, move each delivery's state forward, then add the pushes to
        the subscription's figures over time (`pushstats`, written within 2 s)."""
        if not outcomes:
            return
        async with self.gate.guard("outcomes", BATCH_WRITE_TIMEOUT_S):
            await self._record_attempts_and_states(outcomes)
        self.push_figures.add(o.result for o in outcomes if o.pushed)

    async def record_backlog_sample(self, subscription: str, backlog: int,
                                    oldest_age_s: float) -> None:
        await self._upsert_push_stats(
            pushstats.backlog_writes(subscription, utcnow(), backlog, oldest_age_s))

    async def _upsert_push_stats(self, writes: list[UpdateOne]) -> None:
        """Best effort: the figures are for people, the trace is the record. Two processes
        upserting a new bucket at once: one loses with a duplicate key and writes again."""
        for _ in range(2):
            if not writes:
                return
            try:
                async with self.gate.guard("push figures", PUSH_FIGURES_TIMEOUT_S):
                    await self.push_stats.bulk_write(writes, ordered=False)
                return
            except BulkWriteError as exc:
                errors = exc.details.get("writeErrors", [])
                if any(e.get("code") != _DUPLICATE_KEY for e in errors):
                    log.warning("push figures not recorded: %s", errors[:1])
                    return
                writes = [writes[e["index"]] for e in errors]
            except (MongoUnavailable, PyMongoError) as exc:
                log.warning("push figures not recorded: %s", exc)
                return

    async def push_stats_since(self, subscription: str, unit: str,
                               since: datetime) -> list[dict[str, Any]]:
        cursor = self.push_stats.find(
            {"subscription": subscription, "unit": unit, "at": {"$gte": since}},
            {"failures": 0}).sort("at", ASCENDING)
        return [doc async for doc in cursor]

    async def latest_push_failures(self, subscription: str, limit: int) -> list[dict[str, Any]]:
        """The newest failed pushes of a subscription (at most FAILURES_KEPT per minute)."""
        cursor = self.push_stats.find(
            {"subscription": subscription, "unit": "minute", "last_failure_at": {"$exists": True}},
            {"failures": 1}).sort("at", DESCENDING).limit(limit)
        failures = [f async for doc in cursor for f in doc["failures"]]
        return sorted(failures, key=lambda f: f["at"], reverse=True)[:limit]

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
                await self.attempts.insert_many(attempts, ordered=False)
        except BulkWriteError as exc:
            raise_unless_duplicates(exc)
        groups = list(_group_by_delivery(outcomes).values())
        # a first attempt's delivery has no state yet, as a rule; a retry's has one
        first = [g for g in groups if g[0].result.attempt <= 1]
        updates = [g for g in groups if g[0].result.attempt > 1]
        # a delivery scheduled again (a redelivery) keeps the state it has
        updates += [g for g in await self._insert_new_states(first) if not _only_scheduled(g)]
        if not updates:
            return
        try:
            await self.deliveries.bulk_write([_state_update(g) for g in updates],
                                             ordered=False)
        except BulkWriteError as exc:
            raise_unless_duplicates(exc)  # duplicate key = already delivered: as intended

    async def _insert_new_states(self, groups: list[list[DeliveryOutcome]]
                                 ) -> list[list[DeliveryOutcome]]:
        """Inserts the groups' states; returns the groups whose delivery has one already."""
        if not groups:
            return []
        try:
            await self.deliveries.insert_many([_new_state(g) for g in groups], ordered=False)
        except BulkWriteError as exc:
            raise_unless_duplicates(exc)
            return [groups[e["index"]] for e in exc.details.get("writeErrors", [])]
        return []

    # --- queries -------------------------------------------------------------------------

    async def get_message(self, message_id: str) -> dict[str, Any]:
        doc = await self.messages.find_one({"_id": message_id})
        if doc is None:
            raise NotFound(f"unknown message {message_id!r}", field="message_id")
        return doc

    async def find_messages(
        self, *, biz_id: str | None = None, destination: str | None = None,
        since: datetime | None = None, until: datetime | None = None, limit: int = 100,
    ) -> list[dict[str, Any]]:
        query: dict[str, Any] = {}
        if biz_id is not None:
            query["biz_id"] = biz_id
        if destination is not None:
            query["destination"] = destination
        if since is not None or until is not None:
            window: dict[str, datetime] = {}
            if since is not None:
                window["$gte"] = since
            if until is not None:
                window["$lt"] = until
            query["created_at"] = window
        cursor = self.messages.find(query).sort("created_at", DESCENDING).limit(limit)
        return [d async for d in cursor]

    async def handled_among(self, subscription: str, message_ids: Sequence[str]) -> set[str]:
        """Which of these messages MongoDB shows handled for `subscription`: delivered, or
        failed and with the compensator (or parked, skipped, discarded) — anything but pending
        or retried in place by a dispatcher."""
        if not message_ids:
            return set()
        ids = [delivery_id(m, subscription) for m in message_ids]
        query = {"status": {"$nin": [DeliveryStatus.PENDING.value,
                                     DeliveryStatus.RETRYING.value]}}
        found = await find_by_ids(self.deliveries, ids, query,
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
        found = await find_by_ids(self.deliveries, ids, query, {"message_id": 1})
        return {str(doc["message_id"]) for doc in found}

    async def deliveries_of(self, message_id: str) -> list[dict[str, Any]]:
        """The message's delivery states by subscription; a subscription it was recorded for
        that has no outcome yet shows as pending."""
        cursor = self.deliveries.find({"message_id": message_id})
        states = {d["subscription"]: d async for d in cursor}
        message = await self.messages.find_one({"_id": message_id})
        if message is not None:
            envelope = docs.envelope_from_doc(message)
            for sub_id in message.get("subscriptions") or []:
                if sub_id not in states:
                    states[sub_id] = docs.delivery_doc(
                        envelope, sub_id, envelope.accepted_at)
        return [states[sub_id] for sub_id in sorted(states)]

    async def attempts_of(self, message_id: str) -> list[dict[str, Any]]:
        cursor = self.attempts.find({"message_id": message_id}).sort("started_at", ASCENDING)
        return [d async for d in cursor]

    async def deliveries_by_status(
        self, subscription: str, status: DeliveryStatus, limit: int = 100
    ) -> list[dict[str, Any]]:
        cursor = self.deliveries.find({"subscription": subscription, "status": status.value})
        return [d async for d in cursor.sort("created_at", ASCENDING).limit(limit)]

    async def count_deliveries(self, subscription: str, status: DeliveryStatus) -> int:
        return await self.deliveries.count_documents(
            {"subscription": subscription, "status": status.value})

    async def pending_message_ids(self, subscription: str, limit: int) -> list[str]:
        """Up to `limit` of the newest messages recorded for `subscription` that have no
        outcome yet, newest first."""
        ids: list[str] = []
        batches = self.pending_batches.find({"subscription": subscription}, {"message_ids": 1})
        async for batch in batches.sort("recorded_at", DESCENDING):
            ids += reversed(batch["message_ids"])
            if len(ids) >= limit:
                break
        done = await self.with_state_among(subscription, ids)
        return [m for m in ids if m not in done][:limit]

    async def backlog(self, subscription: str, cap: int) -> tuple[int, datetime | None]:
        """Deliveries of a subscription not yet done (at most about `cap` counted) and the
        creation time of the oldest: the messages of its pending batches (those the last
        sweep has not seen an outcome of) and its undelivered states, each an index range."""
        count, oldest = 0, None
        batches = self.pending_batches.find({"subscription": subscription},
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
            count += await self.deliveries.count_documents(query, limit=cap)
            first = await self.deliveries.find_one(query, {"created_at": 1},
                                                   sort=[("created_at", ASCENDING)])
            if first is not None and (oldest is None or first["created_at"] < oldest):
                oldest = first["created_at"]
        return min(count, cap), oldest


def _group_by_delivery(outcomes: Sequence[DeliveryOutcome]) -> dict[str, list[DeliveryOutcome]]:
    groups: dict[str, list[DeliveryOutcome]] = {}
    for outcome in outcomes:
        key = delivery_id(outcome.result.message_id, outcome.result.subscription)
        groups.setdefault(key, []).append(outcome)
    return groups


def _state_fields(group: list[DeliveryOutcome]) -> tuple[dict[str, Any], bool]:
    """The fields the group's outcomes set, and whether one of them delivered."""
    delivered = next((o for o in group if o.result.ok), None)
    final = delivered or group[-1]
    result = final.result
    now = utcnow()
    fields: dict[str, Any] = {"updated_at": now}
    if final.pushed or final.skipped:
        fields.update(last_status_code=result.status_code, last_error=result.error,
                      last_latency_ms=result.latency_ms, last_attempt_at=result.started_at)
    if delivered is not None:
        fields.update(status=DeliveryStatus.DELIVERED.value, delivered_at=now, next_attempt_at=None)
    else:
        fields.update(status=_failed_status(final).value, next_attempt_at=final.next_attempt_at)
    scheduled = next((o.scheduled_for for o in group if o.scheduled_for is not None), None)
    if scheduled is not None:
        fields["scheduled_for"] = scheduled
    return fields, delivered is not None


def _identity(group: list[DeliveryOutcome]) -> dict[str, Any]:
    """What a delivery's state says of the message, whichever write creates it."""
    final = group[-1]
    return {
        "message_id": final.result.message_id,
        "subscription": final.result.subscription,
        "destination": final.destination,
        "biz_id": final.biz_id,
        "created_at": final.created_at,
    }


def _attempts(group: list[DeliveryOutcome]) -> int:
    return sum(1 for o in group if o.pushed)


def _only_scheduled(group: list[DeliveryOutcome]) -> bool:
    return all(o.scheduled_for is not None for o in group)


def _held_in_place(delivery: dict[str, Any]) -> bool:
    """Scheduled, and held by an ordered subscription's dispatcher (no compensator takes it):
    a redelivered copy must be admitted again, or it would never be pushed."""
    return (delivery.get("status") == DeliveryStatus.SCHEDULED.value
            and delivery.get("next_attempt_at") is None)


def _new_state(group: list[DeliveryOutcome]) -> dict[str, Any]:
    fields, _ = _state_fields(group)
    identity = _identity(group)
    return {"_id": delivery_id(identity["message_id"], identity["subscription"]),
            **identity, **fields, "attempts": _attempts(group)}


def _state_update(group: list[DeliveryOutcome]) -> UpdateOne:
    fields, delivered = _state_fields(group)
    identity = _identity(group)
    query: dict[str, Any] = {"_id": delivery_id(identity["message_id"], identity["subscription"])}
    if not delivered:
        query["status"] = {"$ne": DeliveryStatus.DELIVERED.value}
    return UpdateOne(query, {"$set": fields, "$inc": {"attempts": _attempts(group)},
                             "$setOnInsert": identity}, upsert=True)


def _failed_status(outcome: DeliveryOutcome) -> DeliveryStatus:
    if outcome.scheduled_for is not None:
        return DeliveryStatus.SCHEDULED
    if outcome.skipped:
        return DeliveryStatus.SKIPPED
    if outcome.parked:
        return DeliveryStatus.PARKED
    if outcome.retrying_in_place:
        return DeliveryStatus.RETRYING
    return DeliveryStatus.FAILED
