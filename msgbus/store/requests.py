"""`SubscriptionRequests`: a team's request to subscribe to a destination that takes other
teams' subscriptions on its team's approval (`subscription_requests`; `_id` is a UUIDv7). The
destination's team accepts it (the subscription is made, owned by the team that asked) or
declines it; either way it stays, as a record of who decided what."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field
from pymongo import DESCENDING, ReturnDocument

from msgbus.errors import Conflict, NotFound
from msgbus.ids import uuid7
from msgbus.models import utcnow
from msgbus.store.mongo import MongoStore


class RequestState(StrEnum):
    PENDING = "pending"
    ACCEPTED = "accepted"
    DECLINED = "declined"


class SubscriptionRequest(BaseModel):
    request_id: str = Field(alias="_id")
    destination: str
    name: str
    team: str  # the team that asks, and will own the subscription
    settings: dict[str, Any]  # the subscription's, as PUT .../subscriptions/{name} takes them
    note: str = ""
    requested_by: str
    requested_at: datetime
    state: RequestState = RequestState.PENDING
    decided_by: str | None = None
    decided_at: datetime | None = None
    reason: str = ""


class SubscriptionRequests:
    def __init__(self, store: MongoStore) -> None:
        self._requests = store.db["subscription_requests"]

    async def create(self, destination: str, name: str, team: str, settings: dict[str, Any],
                     note: str, by: str) -> SubscriptionRequest:
        pending = await self._requests.find_one({"destination": destination, "name": name,
                                                 "state": RequestState.PENDING.value})
        if pending is not None:
            raise Conflict(f"a request for {destination}/{name} is pending already "
                           f"({pending['_id']})", field="name")
        doc = {"_id": uuid7(), "destination": destination, "name": name, "team": team,
               "settings": settings, "note": note, "requested_by": by,
               "requested_at": utcnow(), "state": RequestState.PENDING.value}
        await self._requests.insert_one(doc)
        return SubscriptionRequest.model_validate(doc)

    async def get(self, request_id: str) -> SubscriptionRequest:
        doc = await self._requests.find_one({"_id": request_id})
        if doc is None:
            raise NotFound(f"unknown subscription request {request_id!r}", field="request_id")
        return SubscriptionRequest.model_validate(doc)

    async def recent(self, limit: int, state: RequestState | None = None
                     ) -> list[SubscriptionRequest]:
        query = {} if state is None else {"state": state.value}
        found = self._requests.find(query).sort("requested_at", DESCENDING).limit(limit)
        return [SubscriptionRequest.model_validate(doc) async for doc in found]

    async def decide(self, request_id: str, state: RequestState, by: str,
                     reason: str) -> SubscriptionRequest:
        """Accepted or declined, once: a request decided already is a Conflict."""
        doc = await self._requests.find_one_and_update(
            {"_id": request_id, "state": RequestState.PENDING.value},
            {"$set": {"state": state.value, "decided_by": by, "decided_at": utcnow(),
                      "reason": reason}}, return_document=ReturnDocument.AFTER)
        if doc is None:
            current = await self.get(request_id)
            raise Conflict(f"the request was {current.state} already by {current.decided_by}",
                           field="request_id")
        return SubscriptionRequest.model_validate(doc)

    async def reopen(self, request_id: str) -> None:
        """Pending again (its acceptance could not be carried out)."""
        await self._requests.update_one({"_id": request_id}, {"$set": {
            "state": RequestState.PENDING.value, "decided_by": None, "decided_at": None}})
