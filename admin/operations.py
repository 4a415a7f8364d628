"""Operator actions of the management API: parked deliveries (list, re-drive) and replay jobs
(dry run, create, start, pause, resume, cancel, progress). Every change is audited with who
asked (`requested_by`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI
from fastapi.params import Depends

from admin.schemas import OperatorIn, RedriveIn, ReplayIn
from msgbus.errors import InvalidInput, NotFound
from msgbus.models import ReplaySpec, ReplayState, subscription_id
from msgbus.store import MongoStore
from msgbus.store.claims import DeliveryClaims
from msgbus.store.replays import ReplayStore

log = logging.getLogger(__name__)

# state changes an operator may ask for: target -> the states it may come from
TRANSITIONS: dict[str, tuple[ReplayState, tuple[ReplayState, ...]]] = {
    "start": (ReplayState.RUNNING, (ReplayState.PLANNED,)),
    "pause": (ReplayState.PAUSED, (ReplayState.RUNNING,)),
    "resume": (ReplayState.RUNNING, (ReplayState.PAUSED,)),
    "cancel": (ReplayState.CANCELLED,
               (ReplayState.PLANNED, ReplayState.RUNNING, ReplayState.PAUSED)),
}


def replay_view(job: dict[str, Any]) -> dict[str, Any]:
    view = {k: v for k, v in job.items() if k not in ("_id", "lease_owner", "lease_until")}
    return {"replay_id": job["_id"], **view}


async def replay_targets(store: MongoStore, spec: ReplaySpec) -> list[str]:
    """The subscription ids a replay of `spec` pushes to; clear errors for unknown names."""
    await store.get_destination(spec.destination)
    existing = {s.name: s.id for s in await store.list_subscriptions(spec.destination)}
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


def add_operation_routes(app: FastAPI, store: MongoStore, admin: Sequence[Depends]) -> None:
    claims = DeliveryClaims(store, owner="admin")
    replays = ReplayStore(store)
    deps = list(admin)

    @app.get("/v1/destinations/{code}/subscriptions/{name}/parked", dependencies=deps)
    async def list_parked(code: str, name: str, limit: int = 100) -> list[dict[str, Any]]:
        """Deliveries the retry policy gave up on (dead letters), oldest first."""
        sub = await store.get_subscription(subscription_id(code, name))
        found = await claims.parked(sub.id, max(1, min(limit, 1000)))
        return [{k: v for k, v in d.items() if k != "_id"} for d in found]

    @app.post("/v1/destinations/{code}/subscriptions/{name}/parked/redrive",
              dependencies=deps)
    async def redrive_parked(code: str, name: str, body: RedriveIn) -> dict[str, Any]:
        """Parked deliveries (all, or those of `message_ids`) are retried again at once, their
        policy's attempt count and age starting afresh."""
        sub = await store.get_subscription(subscription_id(code, name))
        count = await claims.redrive(sub.id, body.message_ids)
        log.info("audit: %s re-drove %d parked deliveries of %s", body.requested_by, count,
                 sub.id)
        return {"subscription": sub.id, "redriven": count, "requested_by": body.requested_by}

    @app.post("/v1/replays", dependencies=deps)
    async def create_replay(body: ReplayIn) -> dict[str, Any]:
        spec = ReplaySpec.model_validate(body.model_dump(exclude={"dry_run", "requested_by"}))
        targets = await replay_targets(store, spec)
        planned = await replays.count_planned(spec, targets)
        if body.dry_run:
            return {"dry_run": True, "planned": planned, "subscriptions": targets,
                    "spec": spec.model_dump(mode="json")}
        job = await replays.create(spec, targets, planned, body.requested_by)
        log.info("audit: %s created replay %s of %s (%d pushes planned)", body.requested_by,
                 job["_id"], spec.destination, planned)
        return replay_view(job)

    @app.get("/v1/replays", dependencies=deps)
    async def list_replays(limit: int = 50) -> list[dict[str, Any]]:
        return [replay_view(j) for j in await replays.recent(max(1, min(limit, 500)))]

    @app.get("/v1/replays/{replay_id}", dependencies=deps)
    async def get_replay(replay_id: str) -> dict[str, Any]:
        return replay_view(await replays.get(replay_id))

    @app.post("/v1/replays/{replay_id}/{action}", dependencies=deps)
    async def change_replay(replay_id: str, action: str,
                            body: OperatorIn | None = None) -> dict[str, Any]:
        if action not in TRANSITIONS:
            raise NotFound(f"unknown replay action {action!r}; one of "
                           f"{', '.join(TRANSITIONS)}", field="action")
        by = (body or OperatorIn()).requested_by
        to, allowed_from = TRANSITIONS[action]
        job = await replays.transition(replay_id, allowed_from, to, by)
        log.info("audit: %s: replay %s -> %s", by, replay_id, to.value)
        return replay_view(job)
