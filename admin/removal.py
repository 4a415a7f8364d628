"""Deleting subscriptions and destinations, and skipping a subscription's backlog to now.

- `DELETE /v1/destinations/{code}/subscriptions/{name}` and `DELETE /v1/destinations/{code}`
  (admin): the configuration goes at once (every dispatcher, compensator and receiver stops
  using it within a registry refresh) and a deletion is recorded; a dispatcher then removes
  the consumer groups, queues, topics and exchanges (`dispatcher/cleanup.py`). Records and
  traces stay until retention. The same name cannot be created again until then (409).
- `POST /v1/destinations/{code}/subscriptions/{name}/skip` (operator): what the subscription
  has not yet got — in its broker, in the retries, with a dispatcher — is recorded as `skipped`
  with the operator's reason instead of pushed; what arrives afterwards is pushed.
All three are audited."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from admin.access import (
    ChangesDestination,
    ChangesSubscription,
    OperatesSubscription,
    tell_if_someone_else,
)
from admin.deps import Claims, Deletions, Service, Store, Users
from admin.operations import actor
from admin.params import DestinationCode, SubscriptionName
from admin.schemas import OPERATOR_PATTERN
from msgbus.errors import Conflict
from msgbus.models import subscription_id, utcnow
from msgbus.store import MongoStore
from msgbus.store.deletions import DESTINATION, SUBSCRIPTION, DeletionStore
from msgbus.store.schemas import SchemaStore


class SkipIn(BaseModel):
    reason: str = Field(min_length=1, max_length=500,
                        description="why, recorded on every skipped delivery and in the audit")
    requested_by: str | None = Field(default=None, pattern=OPERATOR_PATTERN)


async def refuse_while_deleting(deletions: DeletionStore, code: str,
                                name: str | None = None) -> None:
    """A 409 while a deletion of the same destination or subscription is being completed."""
    pending = await deletions.is_pending(DESTINATION, code) or (
        name is not None and await deletions.is_pending(SUBSCRIPTION, f"{code}/{name}"))
    if pending:
        what = code if name is None else f"{code}/{name}"
        raise Conflict(f"{what} was deleted and its broker resources are still being removed;"
                       " try again in a minute", field="code" if name is None else "name")


router = APIRouter()


async def _delete_one_subscription(store: MongoStore, deletions: DeletionStore, code: str,
                                   name: str, by: str) -> None:
    await deletions.record(SUBSCRIPTION, code, name, by)
    await store.config.delete_subscription(subscription_id(code, name))


@router.delete("/v1/destinations/{code}/subscriptions/{name}")
async def delete_subscription(code: DestinationCode, name: SubscriptionName,
                              who: ChangesSubscription,
                              store: Store, users: Users, service: Service,
                              deletions: Deletions) -> dict[str, Any]:
    """Stops its pushes everywhere and removes its consumer group and queue; its records
    stay until retention. Its team hears of it when someone else deleted it."""
    sub = await store.config.get_subscription(subscription_id(code, name))
    await tell_if_someone_else(store, service.notifier, who, "subscription.deleted", code, name)
    await _delete_one_subscription(store, deletions, code, name, who.name)
    await users.audit(who, "subscription.delete", sub.id)
    return {"deleted": sub.id}


@router.delete("/v1/destinations/{code}")
async def delete_destination(code: DestinationCode, who: ChangesDestination, store: Store,
                             users: Users,
                             deletions: Deletions) -> dict[str, Any]:
    """Deletes the destination and every subscription of it: producers get 404, pushes
    stop, topics, exchanges, consumer groups and queues are removed; records stay until
    retention."""
    await store.config.get_destination(code)
    names = [s.name for s in await store.config.list_subscriptions(code)]
    await deletions.record(DESTINATION, code, None, who.name)
    for name in names:
        await _delete_one_subscription(store, deletions, code, name, who.name)
    await store.config.delete_destination(code)
    await SchemaStore(store).delete_destination(code)
    await users.audit(who, "destination.delete", code, {"subscriptions": names})
    return {"deleted": code, "subscriptions": names}


@router.post("/v1/destinations/{code}/subscriptions/{name}/skip")
async def skip_backlog(code: DestinationCode, name: SubscriptionName, body: SkipIn,
                       who: OperatesSubscription, store: Store, users: Users,
                       claims: Claims) -> dict[str, Any]:
    """Everything received before now that the subscription has not got is recorded as
    skipped with `reason` instead of pushed."""
    sub = await store.config.get_subscription(subscription_id(code, name))
    now = utcnow()
    by = actor(who, body.requested_by)
    reason = f"{body.reason} (by {by})"
    await store.config.save_subscription(sub.model_copy(update={
        "skip_before": now, "skip_reason": reason, "updated_at": now}))
    skipped = await claims.skip_open(sub.id, f"skipped by an operator: {reason}")
    await users.audit(who, "subscription.skip", sub.id,
                      {"reason": body.reason, "by": by, "skipped_states": skipped})
    return {"subscription": sub.id, "skip_before": now.isoformat(), "reason": reason,
            "skipped_states": skipped}
