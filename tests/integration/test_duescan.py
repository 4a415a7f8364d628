"""`DueScan` on a real MongoDB-protocol server: due retries come oldest first and each exactly
once over many claims, what is not due (or not failed, or another subscription's) never comes,
and a retry written below the floor (a failure recorded late) is found by the next full scan."""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from typing import Any

import pytest
from msgbus_devtools.testkit.waiting import eventually_async

from msgbus.ids import uuid7
from msgbus.models import DeliveryStatus, utcnow
from msgbus.store import MongoStore
from msgbus.store.claims import DeliveryClaims
from msgbus.store.duescan import DueScan

pytestmark = pytest.mark.integration

SUB = "orders/billing"


def delivery(next_attempt_at: datetime, *, sub: str = SUB,
             status: DeliveryStatus = DeliveryStatus.FAILED) -> dict[str, Any]:
    message_id = uuid7()
    return {"_id": f"{message_id}|{sub}", "message_id": message_id, "subscription": sub,
            "status": status.value, "next_attempt_at": next_attempt_at, "created_at": utcnow()}


async def lease(store: MongoStore, ids: list[str]) -> None:
    await store.db.deliveries.update_many(
        {"_id": {"$in": ids}}, {"$set": {"next_attempt_at": utcnow() + timedelta(hours=1)}})


async def claim_all(store: MongoStore, scan: DueScan, batch: int) -> list[str]:
    """Claims like the compensator: take a batch, lease it (out of the due range), again."""
    taken: list[str] = []
    while ids := await scan.due_ids(SUB, utcnow(), batch):
        taken += ids
        await lease(store, ids)
    return taken


async def test_due_retries_come_oldest_first_each_once(store: MongoStore) -> None:
    now = utcnow()
    # dense and sparse stretches over the last two hours, plus what must never come
    ages_s = ([random.uniform(0, 7200) for _ in range(150)]
              + [3000 + random.uniform(0, 0.05) for _ in range(120)])
    due = [delivery(now - timedelta(seconds=age)) for age in ages_s]
    others = [delivery(now + timedelta(minutes=5)),
              delivery(now - timedelta(seconds=5), sub="orders/other"),
              delivery(now - timedelta(seconds=5), status=DeliveryStatus.PARKED),
              delivery(now - timedelta(seconds=5), status=DeliveryStatus.DELIVERED)]
    await store.db.deliveries.insert_many(due + others)

    scan = DueScan(store.db.deliveries)
    first = await scan.due_ids(SUB, utcnow(), 40)
    oldest = sorted(due, key=lambda d: d["next_attempt_at"])
    assert first == [d["_id"] for d in oldest[:40]], "the oldest due come first, in order"
    await lease(store, first)

    taken = first + await claim_all(store, scan, 40)
    assert len(taken) == len(set(taken)), "a due retry was handed out twice"
    assert set(taken) == {d["_id"] for d in due}, "every due retry, and nothing else"


async def test_a_retry_recorded_below_the_floor_is_found_by_the_next_full_scan(
        store: MongoStore) -> None:
    scan = DueScan(store.db.deliveries, margin_s=1.0, rescan_s=0.5)
    recent = delivery(utcnow() - timedelta(seconds=2))
    await store.db.deliveries.insert_one(recent)
    assert await claim_all(store, scan, 10) == [recent["_id"]]

    # a dispatcher's trace held back while MongoDB was down: due an hour ago, written now
    late = delivery(utcnow() - timedelta(hours=1))
    await store.db.deliveries.insert_one(late)
    found = await eventually_async(lambda: scan.due_ids(SUB, utcnow(), 10), 5, "the late delivery")
    assert found == [late["_id"]]


class CountingScan(DueScan):
    windows = 0
    windows_with_ids = 0

    async def _window(self, *args: Any, **kwargs: Any) -> list[str]:
        self.windows += 1
        found = await super()._window(*args, **kwargs)
        self.windows_with_ids += bool(found)
        return found


async def test_an_idle_subscription_costs_one_query_per_scan(store: MongoStore) -> None:
    await store.db.deliveries.insert_one(delivery(utcnow() + timedelta(minutes=10)))
    scan = CountingScan(store.db.deliveries)
    assert await scan.due_ids(SUB, utcnow(), 10) == []  # the full scan
    for _ in range(3):
        before = scan.windows
        assert await scan.due_ids(SUB, utcnow(), 10) == []
        assert scan.windows - before == 1
    soon = delivery(utcnow() - timedelta(milliseconds=1))
    await store.db.deliveries.insert_one(soon)
    assert await scan.due_ids(SUB, utcnow(), 10) == [soon["_id"]]


async def test_a_thousand_due_at_one_instant_are_claimed_with_few_queries(
        store: MongoStore) -> None:
    """A sweep or a re-drive makes thousands due at the same instant: no time window can split
    them, and each window query reads all of them on the test server, so a scan keeps the ids
    found beyond one claim for the next claims instead of reading them all again each time."""
    instant = utcnow() - timedelta(seconds=1)
    due = [delivery(instant) for _ in range(1000)]
    await store.db.deliveries.insert_many(due)
    scan = CountingScan(store.db.deliveries)
    taken = await claim_all(store, scan, 50)
    assert sorted(taken) == sorted(d["_id"] for d in due) and len(set(taken)) == len(taken)
    # 1,000 in claims of 50 would be 20 queries reading the instant; 8 claims' worth each: 3
    assert scan.windows_with_ids == 3


@pytest.mark.parametrize("walk", [True, False], ids=["index walk", "each subscription"])
async def test_one_scan_names_the_subscriptions_with_something_due_and_goes_on_after_a_limit(
        store: MongoStore, walk: bool) -> None:
    now = utcnow()
    past, future = now - timedelta(seconds=30), now + timedelta(minutes=5)
    due_subs = [f"d{n:02}/s" for n in range(12)]
    docs = [delivery(past, sub=sub) for sub in due_subs[:6]]
    docs += [delivery(past, sub=sub, status=DeliveryStatus.SCHEDULED) for sub in due_subs[6:]]
    # many subscriptions with nothing due: delivered, parked, not due yet, or held by an
    # ordered subscription's dispatcher (scheduled without a due time)
    for n in range(300):
        sub = f"idle{n:03}/s"
        docs += [delivery(past, sub=sub, status=DeliveryStatus.DELIVERED),
                 delivery(past, sub=sub, status=DeliveryStatus.PARKED),
                 delivery(future, sub=sub)]
        held = delivery(past, sub=sub, status=DeliveryStatus.SCHEDULED)
        docs.append(held | {"next_attempt_at": None})
    await store.db.deliveries.insert_many(docs)
    store.index_skip_scans = walk
    claims = DeliveryClaims(store, "compensator:test")
    known = sorted({d["subscription"] for d in docs} | {"never/used"})

    assert await claims.subscriptions_due(utcnow(), known, limit=100) == due_subs
    first = await claims.subscriptions_due(utcnow(), known, limit=5)
    rest = await claims.subscriptions_due(utcnow(), known, after=first[-1], limit=100)
    assert first + rest == due_subs, "a round goes on after the last one the previous found"
