"""`DeliveredCheck` on a real MongoDB-protocol server: which messages handed out again (or old)
a subscriber already has, that first hand-outs cost no lookup, and that a MongoDB outage costs
one lookup timeout, not one per batch."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pytest
from msgbus_devtools import servers as services

from dispatcher.redelivery import DeliveredCheck
from msgbus.ids import uuid7
from msgbus.models import AttemptResult, DeliveryOutcome, Envelope, utcnow
from msgbus.store import MongoStore
from msgbus.store.progress import DeliveryProgress

pytestmark = pytest.mark.integration

SUB = "orders/billing"


class CountingProgress(DeliveryProgress):
    lookups = 0

    async def handled_among(self, subscription: str, message_ids: Sequence[str]) -> set[str]:
        self.lookups += 1
        return await super().handled_among(subscription, message_ids)


class CountingStore(MongoStore):
    """A real store that counts the lookups made through it."""

    def __init__(self, uri: str, db_name: str, **options: Any) -> None:
        super().__init__(uri, db_name, **options)
        self.progress = self.counting = CountingProgress(self.db)

    @property
    def lookups(self) -> int:
        return self.counting.lookups


@pytest.fixture
def store_class() -> type[MongoStore]:
    """The `store` fixture (tests/integration/conftest.py) makes a CountingStore here."""
    return CountingStore


def envelope(age_s: float, *, redelivered: bool = False) -> Envelope:
    received = utcnow() - timedelta(seconds=age_s)
    return Envelope(message_id=uuid7(), destination="orders", body=b"{}",
                    created_at=received, received_at=received, redelivered=redelivered)


async def deliver(store: MongoStore, envelope: Envelope) -> None:
    result = AttemptResult(message_id=envelope.message_id, subscription=SUB, attempt=1,
                           started_at=utcnow(), latency_ms=2.0, status_code=200)
    await store.records.record_outcomes([DeliveryOutcome(result=result, destination="orders",
                                                         created_at=envelope.created_at)])


async def test_redelivered_and_old_messages_already_delivered_are_found(
        store: CountingStore) -> None:
    check = DeliveredCheck(store, after_s=20.0)
    delivered_again, undelivered_again = envelope(0, redelivered=True), envelope(
        0, redelivered=True)
    delivered_old, undelivered_old = envelope(30), envelope(30)

    # created long ago, accepted just now (a client spooled it): the sweep counts its age
    # from its creation, and so does the check
    spooled = envelope(0)
    spooled.created_at -= timedelta(seconds=30)
    for e in (delivered_again, delivered_old, spooled):
        await deliver(store, e)

    found = await check.already_delivered(SUB, [delivered_again, undelivered_again,
                                                 delivered_old, undelivered_old, spooled])
    assert found == {delivered_again.message_id, delivered_old.message_id, spooled.message_id}
    assert await check.already_delivered("orders/other", [delivered_again]) == set()


async def test_a_first_hand_out_costs_no_lookup_even_in_a_backlog(
        store: CountingStore) -> None:
    """At saturation the broker backlog holds messages seconds old, handed out for the first
    time: asking MongoDB about each would load it for nothing."""
    check = DeliveredCheck(store, after_s=20.0)
    assert await check.already_delivered(SUB, [envelope(0), envelope(8), envelope(15)]) == set()
    assert store.lookups == 0, "first hand-outs were looked up"


async def test_while_mongodb_is_down_old_messages_are_pushed_without_waiting_on_each_batch(
) -> None:
    down = CountingStore(f"mongodb://{services.HOST}:{services.free_port()}", "nowhere",
                         timeout_ms=300)
    check = DeliveredCheck(down, after_s=2.0, timeout_s=1.0)
    try:
        assert await check.already_delivered(SUB, [envelope(30)]) == set()
        assert down.lookups == 1
        for _ in range(5):  # the batches of a backlog during the outage
            assert await check.already_delivered(SUB, [envelope(30)]) == set()
        assert down.lookups == 1, "looked up again while the gate was closed"
        assert not down.gate.available
    finally:
        await down.close()


async def test_what_this_process_delivered_is_known_at_once_even_while_mongodb_is_down(
) -> None:
    down = CountingStore(f"mongodb://{services.HOST}:{services.free_port()}", "nowhere",
                         timeout_ms=300)
    check = DeliveredCheck(down, after_s=2.0, remember=2)
    first, second, third = envelope(0.1), envelope(30), envelope(30)
    try:
        check.remember([(SUB, first.message_id), (SUB, second.message_id)])
        assert await check.already_delivered(SUB, [first, second]) == {
            first.message_id, second.message_id}
        assert await check.already_delivered("orders/other", [first]) == set()
        assert down.lookups == 0, "MongoDB was asked what this process knew"
        check.remember([(SUB, third.message_id)])  # over the capacity: the oldest is forgotten
        assert await check.already_delivered(SUB, [first, third]) == {third.message_id}
    finally:
        await down.close()
