"""A recorded message without an outcome stays pending until it has one or the sweep threshold
passes, whatever order the receiver's records, the dispatchers' outcomes and the sweeps land in;
the backlog counts exactly what is not done."""

from __future__ import annotations

from datetime import timedelta

from pydantic import HttpUrl

from compensator.sweeper import Sweeper
from msgbus.ids import uuid7
from msgbus.models import (
    AttemptResult,
    DeliveryOutcome,
    DeliveryStatus,
    Envelope,
    ReplaySpec,
    Subscription,
    utcnow,
)
from msgbus.settings import CompensatorSettings
from msgbus.store import MongoStore
from msgbus.store.claims import DeliveryClaims
from msgbus.store.pending import PendingSweep
from msgbus.store.replays import ReplayStore

SUB = "orders/billing"
OTHER = "orders/audit"


def _envelopes(count: int) -> list[Envelope]:
    created = utcnow().replace(microsecond=0) - timedelta(seconds=30)  # MongoDB keeps ms
    return [Envelope(message_id=uuid7(), destination="orders", body=b"{}", biz_id=f"o-{n}",
                     created_at=created + timedelta(milliseconds=n)) for n in range(count)]


def _outcome(envelope: Envelope, status: int, sub: str = SUB,
             attempt: int = 1) -> DeliveryOutcome:
    result = AttemptResult(message_id=envelope.message_id, subscription=sub, attempt=attempt,
                           started_at=utcnow(), latency_ms=2.0, status_code=status,
                           error=None if status == 200 else f"HTTP {status}")
    return DeliveryOutcome(result=result, destination="orders", created_at=envelope.created_at,
                           biz_id=envelope.biz_id,
                           next_attempt_at=None if status == 200 else utcnow())


async def _record(store: MongoStore, envelopes: list[Envelope], age_s: float,
                  subs: tuple[str, ...] = (SUB,)) -> None:
    """The receiver's record of a batch, `age_s` seconds ago."""
    await store.records.record_messages([(e, list(subs)) for e in envelopes])
    ids = [e.message_id for e in envelopes]
    await store.db.pending_batches.update_many(
        {"message_ids": {"$in": ids}},
        {"$set": {"recorded_at": utcnow() - timedelta(seconds=age_s)}})


async def _statuses(store: MongoStore, envelopes: list[Envelope],
                    sub: str = SUB) -> list[str]:
    states = [await store.traces.deliveries_of(e.message_id) for e in envelopes]
    return [next(d["status"] for d in found if d["subscription"] == sub) for found in states]


async def _sweep(store: MongoStore, sub: str = SUB, *, threshold_s: float = 60.0) -> int:
    now = utcnow()
    swept = 0
    while True:
        done = await PendingSweep(store).run(
            sub, settle_before=now - timedelta(seconds=5),
            sweep_before=now - timedelta(seconds=threshold_s), limit=2)
        swept += done.swept
        if done.reached_dispatcher or done.batches < 2:
            return swept


async def test_recorded_messages_are_pending_and_counted_until_their_outcome(
        store: MongoStore) -> None:
    envelopes = _envelopes(10)
    await _record(store, envelopes, age_s=10, subs=(SUB, OTHER))
    assert await _statuses(store, envelopes) == ["pending"] * 10
    assert await store.progress.count_deliveries(SUB, DeliveryStatus.PENDING) == 0, \
        "no state is written before the first outcome"
    count, oldest = await store.progress.backlog(SUB, 1000)
    assert (count, oldest) == (10, min(e.created_at for e in envelopes))

    await store.records.record_outcomes([_outcome(e, 200) for e in envelopes[:6]]
                                        + [_outcome(e, 503) for e in envelopes[6:8]])
    assert await _sweep(store) == 0
    assert await _statuses(store, envelopes) == ["delivered"] * 6 + ["failed"] * 2 \
        + ["pending"] * 2
    assert (await store.progress.backlog(SUB, 1000))[0] == 4  # 2 failed + 2 without an outcome
    assert (await store.progress.backlog(OTHER, 1000))[0] == 10, \
        "the other subscription's own batch"


async def test_messages_without_an_outcome_after_the_threshold_are_swept_once_and_due(
        store: MongoStore) -> None:
    envelopes = _envelopes(6)
    await _record(store, envelopes, age_s=120)
    await store.records.record_outcomes([_outcome(e, 200) for e in envelopes[:2]])

    assert await _sweep(store) == 4
    states = [(await store.traces.deliveries_of(e.message_id))[0] for e in envelopes]
    assert [s["status"] for s in states] == ["delivered"] * 2 + ["failed"] * 4
    for state, envelope in zip(states[2:], envelopes[2:], strict=True):
        assert state["next_attempt_at"] <= utcnow() and state["swept_at"] is not None
        assert (state["biz_id"], state["created_at"]) == (envelope.biz_id, envelope.created_at)
    assert await store.db.pending_batches.count_documents({}) == 0
    assert await _sweep(store) == 0, "a message is swept once"

    # the dispatcher's push of a swept message lands after the sweep: delivered wins
    await store.records.record_outcomes([_outcome(envelopes[2], 200)])
    assert (await _statuses(store, envelopes[2:3])) == ["delivered"]


async def test_a_sweep_stops_at_the_backlog_and_leaves_it_pending(store: MongoStore) -> None:
    done, backlog, later = _envelopes(4), _envelopes(5), _envelopes(3)
    await _record(store, done, age_s=40)
    await _record(store, backlog, age_s=30)
    await _record(store, later, age_s=20)
    await store.records.record_outcomes([_outcome(e, 200) for e in done + later])

    assert await _sweep(store) == 0
    remaining = [b async for b in store.db.pending_batches.find({"subscription": SUB})]
    # the first batch settled; the sweep stopped at the backlog's batch and did not look
    # behind it (a later pass will)
    assert sorted(len(b["message_ids"]) for b in remaining) == [3, 5]
    assert await _statuses(store, backlog) == ["pending"] * 5

    # once past the threshold the backlog is swept, the later batch settled
    assert await _sweep(store, threshold_s=25) == 5
    assert await store.db.pending_batches.count_documents({"subscription": SUB}) == 0
    assert await _statuses(store, backlog) == ["failed"] * 5


async def test_the_first_outcome_creates_the_state_and_later_ones_move_it_forward(
        store: MongoStore) -> None:
    [envelope] = _envelopes(1)
    await store.records.record_outcomes([_outcome(envelope, 503)])
    await store.records.record_outcomes([_outcome(envelope, 200)])
    await store.records.record_outcomes([_outcome(envelope, 500)])  # a duplicate push failing later
    await _record(store, [envelope], age_s=120)  # the receiver's record lands last
    assert await _sweep(store) == 0

    [state] = await store.traces.deliveries_of(envelope.message_id)
    assert (state["status"], state["attempts"], state["last_status_code"]) == (
        "delivered", 2, 200)
    assert state["created_at"] == envelope.created_at and state["biz_id"] == envelope.biz_id

    # a retry's outcome written before the first attempt's (two writers) still creates it,
    # and the failed first attempt arriving later does not turn it back
    [other] = _envelopes(1)
    await store.records.record_outcomes([_outcome(other, 200, attempt=2)])
    await store.records.record_outcomes([_outcome(other, 500, attempt=1)])
    [state] = await store.traces.deliveries_of(other.message_id)
    assert (state["status"], state["last_status_code"]) == ("delivered", 200)
    assert len(await store.traces.attempts_of(other.message_id)) == 2


async def test_a_replay_of_pending_deliveries_finds_those_without_an_outcome(
        store: MongoStore) -> None:
    envelopes = _envelopes(8)
    await _record(store, envelopes, age_s=10, subs=(SUB, OTHER))
    await store.records.record_outcomes([_outcome(e, 200) for e in envelopes[:5]]
                                        + [_outcome(e, 500) for e in envelopes[5:6]])
    spec = ReplaySpec(destination="orders", since=envelopes[0].created_at,
                      until=envelopes[-1].created_at + timedelta(seconds=1),
                      statuses=[DeliveryStatus.PENDING, DeliveryStatus.FAILED])
    replays = ReplayStore(store)

    # billing: 2 without an outcome + 1 failed; audit: all 8 without one
    assert await replays.count_planned(spec, [SUB]) == 3
    assert await replays.count_planned(spec, [SUB, OTHER]) == 11
    page = await replays.message_page(spec, None, 100)
    states = await replays.delivery_states(page, [SUB])
    chosen = {k.split("|")[0] for k, s in states.items() if s in spec.statuses}
    assert chosen == {e.message_id for e in envelopes[5:]}


async def test_the_messages_still_pending_are_listed_newest_first(store: MongoStore) -> None:
    older, newer = _envelopes(3), _envelopes(3)
    await _record(store, older, age_s=20)
    await _record(store, newer, age_s=10)
    await store.records.record_outcomes([_outcome(newer[1], 200), _outcome(older[0], 500)])
    listed = await store.progress.pending_message_ids(SUB, 10)
    assert listed == [newer[2].message_id, newer[0].message_id, older[2].message_id,
                      older[1].message_id]
    assert await store.progress.pending_message_ids(SUB, 2) == listed[:2]


async def test_a_recently_changed_subscription_is_settled_but_not_swept(
        store: MongoStore) -> None:
    """Resumed a moment ago, its dispatcher works through what waited: nothing of it is swept
    yet, but what it delivered leaves the backlog; a paused one is left alone."""
    now = utcnow()
    resumed = Subscription(destination="orders", name="billing", url=HttpUrl("http://x/"),
                           updated_at=now)
    paused = Subscription(destination="orders", name="audit", url=HttpUrl("http://x/"),
                          paused=True, updated_at=now - timedelta(hours=1))
    envelopes = _envelopes(6)
    await _record(store, envelopes, age_s=120, subs=(SUB, OTHER))
    await store.records.record_outcomes([_outcome(e, 200) for e in envelopes[:4]])
    sweeper = Sweeper(DeliveryClaims(store, "test"), PendingSweep(store),
                      lambda: [resumed, paused], CompensatorSettings(sweep_after_s=60))

    assert await sweeper.sweep() == 0
    await sweeper.settle()
    assert await _statuses(store, envelopes) == ["delivered"] * 4 + ["pending"] * 2
    assert (await store.progress.backlog(SUB, 1000))[0] == 2
    assert (await store.progress.backlog(OTHER, 1000))[0] == 6
