"""Operator actions of the management API: parked deliveries (list, re-drive) and replay jobs
(dry run, create, start, pause, resume, cancel, progress). Reading needs a viewer, acting an
operator; every action is audited with who asked."""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Path, Query, Response

from admin.access import (
    Catalogue,
    OperatesFromBody,
    OperatesSubscription,
    ReadsSubscription,
    check_on_subscriptions,
    may_on_subscriptions,
)
from admin.deps import Claims, Replays, Service, Shares, Store, Users
from admin.invalid_docs import LIST_RESPONSES, valid_items
from admin.params import DestinationCode, GeneratedId, Limit, SubscriptionName
from admin.schemas import DiscardIn, OperatorIn, RedriveIn, ReplayIn
from msgbus.delivery.batch import batches_of
from msgbus.delivery.senders import make_sender
from msgbus.errors import InvalidInput, NotFound, Unavailable
from msgbus.ids import uuid7
from msgbus.models import Envelope, ReplaySpec, ReplayState, subscription_id
from msgbus.permissions import Right
from msgbus.store import MongoStore
from msgbus.users import Principal

log = logging.getLogger(__name__)

TEST_PUSH_SLOT_WAIT_S = 10.0  # a test push waits this long for a slot of the subscription's cap

# state changes an operator may ask for: target -> the states it may come from
TRANSITIONS: dict[str, tuple[ReplayState, tuple[ReplayState, ...]]] = {
    "start": (ReplayState.RUNNING, (ReplayState.PLANNED,)),
    "pause": (ReplayState.PAUSED, (ReplayState.RUNNING,)),
    "resume": (ReplayState.RUNNING, (ReplayState.PAUSED,)),
    "cancel": (ReplayState.CANCELLED,
               (ReplayState.PLANNED, ReplayState.RUNNING, ReplayState.PAUSED)),
}


ReplayAction = Annotated[str, Path(pattern="^(" + "|".join(TRANSITIONS) + ")$",
                                  description="one of " + ", ".join(TRANSITIONS))]


def replay_view(job: dict[str, Any]) -> dict[str, Any]:
    view = {k: v for k, v in job.items() if k not in ("_id", "lease_owner", "lease_until")}
    return {"replay_id": job["_id"], **view}


async def replay_targets(store: MongoStore, spec: ReplaySpec) -> list[str]:
    """The subscription ids a replay of `spec` pushes to; clear errors for unknown names."""
    await store.config.get_destination(spec.destination)
    existing = {s.name: s.id for s in await store.config.list_subscriptions(spec.destination)}
    if spec.subscriptions is None:
        if not existing:
            raise InvalidInput(f"destination {spec.destination!r} has no subscriptions",
                               field="subscriptions")
        return sorted(existing.values())
    unknown = sorted(set(spec.subscriptions) - set(existing))
    if unknown:
        raise NotFound(f"destination {spec.destination!r} has no subscription "
                       f"{', '.join(map(repr, unknown))}", field="subscriptions")
    return sorted({subscription_id(spec.destination, n) for n in spec.subscriptions})


def actor(who: Principal, requested_by: str | None) -> str:
    """Who the audit names: the user; for the shared bootstrap token, also the name the
    caller gave."""
    if who.via == "bootstrap" and requested_by:
        return f"{requested_by} ({who.name})"
    return who.name


router = APIRouter()


@router.get("/v1/destinations/{code}/subscriptions/{name}/parked")
async def list_parked(code: DestinationCode, name: SubscriptionName, _: ReadsSubscription,
                      store: Store,
                      claims: Claims, limit: Limit = 100) -> list[dict[str, Any]]:
    """Deliveries the retry policy gave up on (dead letters), oldest first."""
    sub = await store.config.get_subscription(subscription_id(code, name))
    found = await claims.parked(sub.id, limit)
    return [{k: v for k, v in d.items() if k != "_id"} for d in found]


@router.post("/v1/destinations/{code}/subscriptions/{name}/parked/redrive")
async def redrive_parked(code: DestinationCode, name: SubscriptionName, body: RedriveIn,
                         who: OperatesSubscription, store: Store, users: Users,
                         claims: Claims) -> dict[str, Any]:
    """Parked deliveries (all, or those of `message_ids`) are retried again at once, their
    policy's attempt count and age starting afresh."""
    sub = await store.config.get_subscription(subscription_id(code, name))
    count = await claims.redrive(sub.id, body.message_ids)
    by = actor(who, body.requested_by)
    await users.audit(who, "parked.redrive", sub.id,
                      {"count": count, "message_ids": body.message_ids, "by": by})
    return {"subscription": sub.id, "redriven": count, "requested_by": by}


@router.post("/v1/destinations/{code}/subscriptions/{name}/parked/discard")
async def discard_parked(code: DestinationCode, name: SubscriptionName, body: DiscardIn,
                         who: OperatesSubscription, store: Store, users: Users,
                         claims: Claims) -> dict[str, Any]:
    """Parked deliveries (all, or those of `message_ids`) are dropped for good, with a
    reason; they stay in the trace as `discarded`."""
    sub = await store.config.get_subscription(subscription_id(code, name))
    count = await claims.discard(sub.id, body.message_ids, body.reason)
    await users.audit(who, "parked.discard", sub.id, {
        "count": count, "message_ids": body.message_ids, "reason": body.reason})
    return {"subscription": sub.id, "discarded": count, "reason": body.reason}


@router.post("/v1/destinations/{code}/subscriptions/{name}/test")
async def test_push(code: DestinationCode, name: SubscriptionName, who: OperatesSubscription,
                    store: Store, users: Users, shares: Shares,
                    service: Service) -> dict[str, Any]:
    """Push a signed test message to the subscriber now (not through a broker, not
    recorded on any trace, within the subscription's max_concurrency like every push);
    answers what the subscriber said and how fast."""
    sub = await store.config.get_subscription(subscription_id(code, name))
    envelope = Envelope(message_id=uuid7(), destination=code,
                        body=orjson.dumps({"msgbus_test": True, "by": who.name}),
                        biz_id="msgbus-test", source_app="msgbus-admin",
                        headers={"test": "true"})
    slots = shares.slots(sub.id, sub.max_concurrency)
    try:
        await asyncio.wait_for(slots.acquire(), TEST_PUSH_SLOT_WAIT_S)
    except TimeoutError:
        shares.forget(sub.id)
        raise Unavailable(f"every slot of {sub.id}'s max_concurrency stayed in use for "
                          f"{TEST_PUSH_SLOT_WAIT_S:.0f} s; try again", retry_after_s=5
                          ) from None
    sender = make_sender("h1", instance="admin-test", push=service.settings.push,
                         keys=service.keys)
    try:
        await sender.start()
        if sub.batched:  # a subscriber that takes batches always gets the batch format
            [result] = await sender.push_batch(batches_of([(envelope, 1)], sub)[0], sub)
        else:
            result = await sender.push(envelope, sub, attempt=1)
    finally:
        await sender.close()
        slots.release()
        shares.forget(sub.id)
    await users.audit(who, "subscription.test", sub.id, {
        "status_code": result.status_code, "error": result.error})
    return {"message_id": envelope.message_id, "ok": result.ok,
            "status_code": result.status_code, "latency_ms": round(result.latency_ms, 1),
            "error": result.error}


@router.post("/v1/replays")
async def create_replay(body: ReplayIn, who: OperatesFromBody, store: Store, users: Users,
                        replays: Replays) -> dict[str, Any]:
    spec = ReplaySpec.model_validate(body.model_dump(exclude={"dry_run", "requested_by"}))
    targets = await replay_targets(store, spec)
    await check_on_subscriptions(store, who, Right.OPERATE, targets)
    planned = await replays.count_planned(spec, targets)
    if body.dry_run:
        return {"dry_run": True, "planned": planned, "subscriptions": targets,
                "spec": spec.model_dump(mode="json")}
    by = actor(who, body.requested_by)
    job = await replays.create(spec, targets, planned, by)
    await users.audit(who, "replay.create", job["_id"],
                      {"planned": planned, "spec": spec.model_dump(mode="json"), "by": by})
    return replay_view(job)


@router.get("/v1/replays", responses=LIST_RESPONSES)
async def list_replays(who: Catalogue, response: Response, replays: Replays, store: Store,
                       limit: Annotated[int, Query(ge=1, le=500)] = 50
                       ) -> list[dict[str, Any]]:
    """The recent replays of subscriptions the caller may read."""
    loaded = await replays.load_recent(limit)
    return [replay_view(j) for j in valid_items(response, loaded)
            if await may_on_subscriptions(store, who, Right.READ, j["subscriptions"])]


@router.get("/v1/replays/{replay_id}")
async def get_replay(replay_id: GeneratedId, who: Catalogue, replays: Replays,
                     store: Store) -> dict[str, Any]:
    job = await replays.get(replay_id)
    await check_on_subscriptions(store, who, Right.READ, job["subscriptions"])
    return replay_view(job)


@router.post("/v1/replays/{replay_id}/{action}")
async def change_replay(replay_id: GeneratedId, action: ReplayAction, who: Catalogue,
                        users: Users, replays: Replays, store: Store,
                        body: OperatorIn | None = None) -> dict[str, Any]:
    if action not in TRANSITIONS:
        raise NotFound(f"unknown replay action {action!r}; one of "
                       f"{', '.join(TRANSITIONS)}", field="action")
    job = await replays.get(replay_id)
    await check_on_subscriptions(store, who, Right.OPERATE, job["subscriptions"])
    by = actor(who, (body or OperatorIn()).requested_by)
    to, allowed_from = TRANSITIONS[action]
    job = await replays.transition(replay_id, allowed_from, to, by)
    await users.audit(who, f"replay.{action}", replay_id, {"by": by, "done": job["done"]})
    return replay_view(job)
