"""Who pushes to a subscription: the dispatchers assigned to it (msgbus/assignment.py), and the
live dispatcher, compensator and admin processes pushing to it: each one's share of the
subscription's max_concurrency (and of its max_rate_per_s), what it asked for, what it had in
flight when it last wrote its share, its last heartbeat, and the state of the subscription's
circuit there with the last success it saw.

`GET /v1/destinations/{code}/subscriptions/{name}/pushers` (viewer); the subscription's page
in the UI shows the same."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter

from admin.access import ReadsSubscription
from admin.deps import Store
from admin.params import DestinationCode, SubscriptionName
from msgbus.assignment import serving
from msgbus.delivery.shares import RATE_SUFFIX
from msgbus.models import BrokerKind, subscription_id, utcnow
from msgbus.store import MongoStore
from msgbus.store.shares import ShareStore


async def pushers_of(store: MongoStore, sub_id: str, dispatchers: int | None = None,
                     brokered: bool = True) -> dict[str, Any]:
    """`dispatchers`, `brokered`: the subscription's setting, and whether its destination has
    a broker (a direct one's are served by every dispatcher)."""
    shares = ShareStore(store)
    now = utcnow()
    live = await shares.live_instances(now)
    live_dispatchers = [name for name, doc in live.items() if doc.get("component") == "dispatcher"]
    docs = await shares.read([sub_id, sub_id + RATE_SUFFIX])
    cap, rate = docs.get(sub_id) or {}, docs.get(sub_id + RATE_SUFFIX) or {}
    rate_shares = {e.get("instance"): e.get("held", 0) for e in rate.get("entries", [])}
    pushers = [{"instance": e["instance"], "component": e.get("component"),
                "share": e.get("held", 0), "demand": e.get("demand", 0),
                "in_flight": e.get("in_use"), "rate_share": rate_shares.get(e["instance"]),
                "share_changed_at": e.get("at"),
                "heartbeat_at": live[e["instance"]].get("heartbeat_at"),
                **_circuit_seen_by(live[e["instance"]], sub_id)}
               for e in cap.get("entries", []) if e.get("instance") in live]
    assigned = serving(sub_id, live_dispatchers, dispatchers if brokered else None)
    return {"subscription": sub_id, "cap": cap.get("cap"), "max_rate_per_s": rate.get("cap"),
            "dispatchers": dispatchers, "assigned": sorted(assigned),
            "circuit_open": any(p["circuit_open"] for p in pushers),
            "pushers": sorted(pushers, key=lambda p: p["instance"])}


def _circuit_seen_by(instance: dict[str, Any], sub_id: str) -> dict[str, Any]:
    report: dict[str, Any] = next(
        (c for c in instance.get("circuits", []) if c.get("subscription") == sub_id), {})
    ok_at = float(report.get("ok_at") or 0)
    return {"circuit_open": bool(report.get("open")),
            "last_success_at": datetime.fromtimestamp(ok_at, UTC) if ok_at else None}


router = APIRouter()


@router.get("/v1/destinations/{code}/subscriptions/{name}/pushers")
async def list_pushers(code: DestinationCode, name: SubscriptionName, _: ReadsSubscription,
                       store: Store) -> dict[str, Any]:
    """The processes pushing to the subscription now and their shares of its cap."""
    sub = await store.config.get_subscription(subscription_id(code, name))
    destination = await store.config.get_destination(code)
    return await pushers_of(store, sub.id, sub.dispatchers,
                            brokered=destination.broker is not BrokerKind.DIRECT)
