"""Scheduled deliveries (delayed delivery: deliver_at, delay_s): list a destination's, deliver
one now, cancel one. Reading needs a viewer, acting an operator; every action is audited.

Only the deliveries the compensator pushes when due can be moved or cancelled. An ordered
subscription's dispatcher holds its own in the key's lane (order beats delay) and pushes them
at their time; for those the actions answer 409 (docs/operations.md)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from admin.access import OperatesSubscription, ReadsDestination
from admin.deps import Claims, Parts, Store, UiUser, Users
from admin.operations import actor
from admin.params import DestinationCode, Limit, SubscriptionName
from admin.schemas import ScheduledCancelIn, ScheduledIn
from admin.ui import PAGE_SIZE, page
from msgbus.errors import Conflict
from msgbus.models import subscription_id
from msgbus.store import MongoStore
from msgbus.store.claims import DeliveryClaims

router = APIRouter()
ui_router = APIRouter(include_in_schema=False)

NOT_CHANGED = ("none of these is a scheduled delivery the compensator holds: delivered, "
               "cancelled or never scheduled, or held in its key's lane by an ordered "
               "subscription's dispatcher (it goes at its time)")


def scheduled_view(delivery: dict[str, Any]) -> dict[str, Any]:
    """A scheduled delivery as the API shows it; `held_in_place`: an ordered subscription's
    dispatcher holds it (no action applies)."""
    view = {k: v for k, v in delivery.items() if k not in ("_id", "lease")}
    return view | {"held_in_place": delivery.get("next_attempt_at") is None}


async def scheduled_of(store: MongoStore, claims: DeliveryClaims, code: str,
                       limit: int) -> list[dict[str, Any]]:
    """The destination's scheduled deliveries, each subscription's soonest first, merged
    by due time."""
    await store.config.get_destination(code)
    found: list[dict[str, Any]] = []
    for sub in await store.config.list_subscriptions(code):
        found += [scheduled_view(d) for d in await claims.scheduled(sub.id, limit)]
    found.sort(key=lambda d: d.get("scheduled_for") or d["created_at"])
    return found[:limit]


@router.get("/v1/destinations/{code}/scheduled")
async def list_scheduled(code: DestinationCode, _: ReadsDestination, store: Store, claims: Claims,
                         limit: Limit = 100) -> list[dict[str, Any]]:
    """Deliveries of the destination's messages that wait for their time, soonest first."""
    return await scheduled_of(store, claims, code, limit)


@router.post("/v1/destinations/{code}/subscriptions/{name}/scheduled/deliver-now")
async def deliver_scheduled_now(code: DestinationCode, name: SubscriptionName,
                                body: ScheduledIn, who: OperatesSubscription, store: Store,
                                users: Users, claims: Claims) -> dict[str, Any]:
    """These messages' scheduled deliveries to the subscription are due now: the
    compensator pushes them within about a second."""
    sub = await store.config.get_subscription(subscription_id(code, name))
    count = await claims.deliver_scheduled_now(sub.id, body.message_ids)
    by = actor(who, body.requested_by)
    await users.audit(who, "scheduled.deliver_now", sub.id,
                      {"count": count, "message_ids": body.message_ids, "by": by})
    if not count:
        raise Conflict(NOT_CHANGED, field="message_ids")
    return {"subscription": sub.id, "delivered_now": count, "requested_by": by}


@router.post("/v1/destinations/{code}/subscriptions/{name}/scheduled/cancel")
async def cancel_scheduled(code: DestinationCode, name: SubscriptionName,
                           body: ScheduledCancelIn, who: OperatesSubscription, store: Store,
                           users: Users, claims: Claims) -> dict[str, Any]:
    """These messages' scheduled deliveries to the subscription are dropped before their
    time, with a reason; they stay in the trace as `discarded`."""
    sub = await store.config.get_subscription(subscription_id(code, name))
    count = await claims.cancel_scheduled(sub.id, body.message_ids, body.reason)
    by = actor(who, body.requested_by)
    await users.audit(who, "scheduled.cancel", sub.id, {
        "count": count, "message_ids": body.message_ids, "reason": body.reason, "by": by})
    if not count:
        raise Conflict(NOT_CHANGED, field="message_ids")
    return {"subscription": sub.id, "cancelled": count, "reason": body.reason,
            "requested_by": by}


@ui_router.get("/ui/destinations/{code}/scheduled", response_model=None)
async def scheduled_page(request: Request, code: str, who: UiUser, store: Store,
                         parts: Parts) -> Response:
    found = await scheduled_of(store, parts.ui_claims, code, PAGE_SIZE)
    return page(request, "scheduled.html", who, page="Destinations", code=code,
                scheduled=found)
