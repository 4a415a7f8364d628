"""`TraceStore`: what the API shows of messages — one message, its delivery states and its
attempts (its trace), the messages of a destination or biz_id, and the reads of the message
list's pages (admin/message_list.py: keys of an index range, then the rows of a page)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from pymongo import ASCENDING, DESCENDING
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase

from msgbus.errors import NotFound
from msgbus.store import documents as docs
from msgbus.store.idsets import find_by_ids

Key = tuple[datetime, str]  # (created_at, message id): the message list's order
# what the message list shows of each delivery state
LISTED_STATE_FIELDS = {"subscription": 1, "message_id": 1, "status": 1, "attempts": 1,
                       "next_attempt_at": 1, "scheduled_for": 1, "last_status_code": 1,
                       "discard_reason": 1}


class TraceStore:
    def __init__(self, db: AsyncDatabase[dict[str, Any]]) -> None:
        self._messages = db["messages"]
        self._deliveries = db["deliveries"]
        self._attempts = db["attempts"]

    async def get_message(self, message_id: str) -> dict[str, Any]:
        doc = await self._messages.find_one({"_id": message_id})
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
        cursor = self._messages.find(query).sort("created_at", DESCENDING).limit(limit)
        return [d async for d in cursor]

    async def deliveries_of(self, message_id: str) -> list[dict[str, Any]]:
        """The message's delivery states by subscription; a subscription it was recorded for
        that has no outcome yet shows as pending."""
        cursor = self._deliveries.find({"message_id": message_id})
        states = {d["subscription"]: d async for d in cursor}
        message = await self._messages.find_one({"_id": message_id})
        if message is not None:
            envelope = docs.envelope_from_doc(message)
            for sub_id in message.get("subscriptions") or []:
                if sub_id not in states:
                    states[sub_id] = docs.delivery_doc(
                        envelope, sub_id, envelope.accepted_at)
        return [states[sub_id] for sub_id in sorted(states)]

    async def attempts_of(self, message_id: str) -> list[dict[str, Any]]:
        cursor = self._attempts.find({"message_id": message_id}).sort("started_at", ASCENDING)
        return [d async for d in cursor]

    # --- the message list ------------------------------------------------------------------

    async def message_keys(self, match: Mapping[str, Any], newest_first: bool,
                           limit: int | None) -> list[Key]:
        """The keys of the messages matching `match` in created_at order, at most `limit`
        (None: all)."""
        return await _keys(self._messages, match, "_id", newest_first, limit)

    async def state_keys(self, match: Mapping[str, Any], newest_first: bool,
                         limit: int | None) -> list[Key]:
        """As `message_keys`, of the messages whose delivery states match `match`."""
        return await _keys(self._deliveries, match, "message_id", newest_first, limit)

    async def messages_by_ids(self, ids: Sequence[str],
                              projection: Mapping[str, Any]) -> list[dict[str, Any]]:
        return await find_by_ids(self._messages, ids, None, projection)

    async def listed_states(self, delivery_ids: Sequence[str]) -> list[dict[str, Any]]:
        """The delivery states among `delivery_ids`, with the fields the list shows."""
        return await find_by_ids(self._deliveries, delivery_ids, None, LISTED_STATE_FIELDS)


async def _keys(collection: AsyncCollection[dict[str, Any]], match: Mapping[str, Any],
                id_field: str, newest_first: bool, limit: int | None) -> list[Key]:
    cursor = collection.find(match, {id_field: 1, "created_at": 1})
    cursor = cursor.sort("created_at", DESCENDING if newest_first else ASCENDING)
    if limit is not None:
        cursor = cursor.limit(limit)
    return [(d["created_at"], str(d[id_field])) async for d in cursor]
