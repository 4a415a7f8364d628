"""Delivery state in MongoDB moves forward only, whatever order the writers' batches land in."""

from __future__ import annotations

from datetime import UTC, datetime

from msgbus.ids import uuid7
from msgbus.models import AttemptResult, DeliveryOutcome, DeliveryStatus, Envelope
from msgbus.store import MongoStore

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
SUB = "orders/billing"


def _outcome(message_id: str, status: int, at_s: int = 0) -> DeliveryOutcome:
    result = AttemptResult(message_id=message_id, subscription=SUB, attempt=1,
                           started_at=NOW.replace(second=at_s), latency_ms=3.5,
                           status_code=status, error=None if status == 200 else f"HTTP {status}")
    return DeliveryOutcome(result=result, destination="orders", created_at=NOW, biz_id="o-1",
                           next_attempt_at=None if status == 200 else NOW)


async def _state(store: MongoStore, message_id: str) -> dict[str, object]:
    deliveries = await store.traces.deliveries_of(message_id)
    assert len(deliveries) == 1
    return deliveries[0]


async def test_delivered_is_final_and_outcomes_may_arrive_before_the_record(
        store: MongoStore) -> None:
    mid = uuid7()
    await store.records.record_outcomes([_outcome(mid, 500, 1)])
    await store.records.record_outcomes([_outcome(mid, 200, 2)])
    await store.records.record_outcomes([_outcome(mid, 503, 3)])  # a duplicate push failing later
    envelope = Envelope(message_id=mid, destination="orders", body=b"{}", created_at=NOW)
    await store.records.record_messages([(envelope, [SUB])])  # the receiver's record lands last
    await store.records.record_messages([(envelope, [SUB])])  # and is re-sent: idempotent

    state = await _state(store, mid)
    assert state["status"] == DeliveryStatus.DELIVERED
    assert state["last_status_code"] == 200 and state["attempts"] == 2
    assert len(await store.traces.attempts_of(mid)) == 3
    assert (await store.traces.get_message(mid))["subscriptions"] == [SUB]


async def test_one_batch_with_failure_then_success_ends_delivered(store: MongoStore) -> None:
    mid = uuid7()
    await store.records.record_messages([(Envelope(message_id=mid, destination="orders", body=b"{}",
                                                   created_at=NOW), [SUB])])
    assert (await _state(store, mid))["status"] == DeliveryStatus.PENDING
    outcomes = [_outcome(mid, 500, 1), _outcome(mid, 200, 2)]
    await store.records.record_outcomes(outcomes)
    await store.records.record_outcomes(outcomes)  # a batch written twice after a crash
    state = await _state(store, mid)
    assert state["status"] == DeliveryStatus.DELIVERED
    assert len(await store.traces.attempts_of(mid)) == 2  # attempts are not duplicated


async def test_failed_delivery_keeps_its_retry_time(store: MongoStore) -> None:
    mid = uuid7()
    await store.records.record_outcomes([_outcome(mid, 500)])
    state = await _state(store, mid)
    assert state["status"] == DeliveryStatus.FAILED
    assert state["next_attempt_at"] == NOW and state["last_error"] == "HTTP 500"
    found = await store.progress.deliveries_by_status(SUB, DeliveryStatus.FAILED)
    assert mid in {d["message_id"] for d in found}



async def test_indexes_of_earlier_versions_that_nothing_reads_are_dropped(
        store: MongoStore) -> None:
    """Each index costs every write of its collection: `ensure_indexes` removes the ones an
    earlier version created and no query uses any more, and keeps the others."""
    await store.db.deliveries.create_index([("status", 1), ("next_attempt_at", 1)])
    await store.ensure_indexes()
    await store.ensure_indexes()  # idempotent
    names = set(await store.db.deliveries.index_information())
    assert "status_1_next_attempt_at_1" not in names
    assert {"subscription_1_status_1_next_attempt_at_1",
            "subscription_1_status_1_created_at_1"} <= names
