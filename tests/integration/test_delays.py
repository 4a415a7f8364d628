"""Delayed delivery on real services (issue 29 part 2): deliver_at / delay_s of a message, a
subscription's delay_s, order beating delay, and the operator's deliver-now and cancel."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from msgbus_client import MsgbusClient
from msgbus_devtools.testkit.bus import RunningBus
from msgbus_devtools.testkit.delays import lateness_s, wall_time
from msgbus_devtools.testkit.subscriber import RecordingSubscriber
from msgbus_devtools.testkit.waiting import eventually

from msgbus.ids import uuid7
from msgbus.models import DeliveryStatus
from msgbus.percentiles import nearest_rank

MESSAGES = 1000
MAX_DELAY_S = 12.0
LATE_LIMIT_S = 2.0


def _setup(bus: RunningBus, unique: str, broker: str, **options: object
           ) -> tuple[str, RecordingSubscriber]:
    destination = f"delays-{broker}-{unique}"
    bus.create_destination(destination, broker)
    subscriber = RecordingSubscriber()
    bus.subscribe(destination, "sub", bus.serve_subscriber(subscriber), **options)
    bus.wait_for_workers([f"{destination}/sub"])
    return destination, subscriber


def _accepted_at(bus: RunningBus, destination: str, count: int) -> dict[str, datetime]:
    """When the receiver accepted each of the destination's `count` messages (once recorded)."""
    def recorded() -> list[dict[str, object]] | None:
        docs = bus.query(bus.store.traces.find_messages(destination=destination, limit=count))
        return docs if len(docs) >= count else None
    docs = eventually(recorded, 30, f"the {count} messages recorded")
    return {str(doc["_id"]): doc["received_at"] for doc in docs}


@pytest.mark.serial
@pytest.mark.parametrize("broker", ["kafka", "rabbitmq", "direct"])
def test_random_delays_none_early_each_within_two_seconds(
        bus: RunningBus, api_key: str, spool_dir: Path, unique: str, broker: str) -> None:
    destination, subscriber = _setup(bus, unique, broker, max_concurrency=32)
    client = MsgbusClient(bus.receiver_url, api_key, spool_dir=spool_dir, group_commit_ms=2)
    # a warm path first: a new Kafka consumer group takes seconds to join, which would count
    # as lateness of the shortest delays
    warm = client.send(destination, {"warm": True})
    eventually(lambda: warm in subscriber.message_ids(), 30, "the first message")
    rng = random.Random(29)
    due: dict[str, datetime] = {}
    asked: dict[str, float] = {}
    for i in range(MESSAGES):
        delay_s = rng.uniform(0, MAX_DELAY_S)
        at = datetime.now(UTC) + timedelta(seconds=delay_s)
        message_id = client.send(destination, {"n": i}, deliver_at=at)
        due[message_id], asked[message_id] = at, delay_s
    assert client.close(30) == 0

    eventually(lambda: subscriber.message_ids() >= set(due), MAX_DELAY_S + 40,
               f"all {MESSAGES} delayed messages pushed")
    pushes = [p for p in subscriber.pushes if p.message_id in due]
    late = lateness_s(pushes, due)
    early = {m: s for m, s in late.items() if s < 0}
    assert not early, f"{len(early)} pushed before their time, e.g. {list(early.items())[:3]}"
    # a message asked for sooner than the burst of sends took to reach the receiver counts from
    # its acceptance: its lateness before that is the client's backlog, not the delay's
    accepted = _accepted_at(bus, destination, len(due) + 1)
    too_late = {m: s for m, s in lateness_s(pushes, {
        m: max(at, accepted[m]) for m, at in due.items()}).items() if s > LATE_LIMIT_S}
    values = list(late.values())
    print(f"{broker}: lateness p50 {nearest_rank(values, 0.5):.3f} s, p99 "
          f"{nearest_rank(values, 0.99):.3f} s, max {max(values):.3f} s")
    assert not too_late, (f"{len(too_late)} more than {LATE_LIMIT_S} s late (late by, "
                          "asked delay): "
                          f"{sorted((s, round(asked[m], 2)) for m, s in too_late.items())}")


def test_a_subscription_delay_holds_every_message_that_long(
        bus: RunningBus, api_key: str, spool_dir: Path, unique: str) -> None:
    destination, subscriber = _setup(bus, unique, "direct", delay_s=5.0)  # > the 3 s held in memory
    client = MsgbusClient(bus.receiver_url, api_key, spool_dir=spool_dir)
    sent = {client.send(destination, {"n": i}) for i in range(20)}
    assert client.close(30) == 0
    eventually(lambda: subscriber.message_ids() >= sent, 30, "the delayed messages")
    for push in subscriber.pushes:  # the subscription's delay counts from acceptance
        accepted = bus.query(bus.store.traces.get_message(push.message_id))["received_at"]
        assert wall_time(push) >= accepted + timedelta(seconds=5.0)
    # the outcome is recorded after the push's answer
    record = eventually(lambda: bus.query(bus.store.db.deliveries.find_one(
        {"subscription": f"{destination}/sub", "status": "delivered"})), 30,
        "a delivered outcome recorded")
    assert record["scheduled_for"] is not None and record["attempts"] == 1


def test_order_beats_delay_a_delayed_head_holds_its_key_only(
        bus: RunningBus, api_key: str, spool_dir: Path, unique: str) -> None:
    destination, subscriber = _setup(bus, unique, "kafka", ordered_by_biz_id=True)
    client = MsgbusClient(bus.receiver_url, api_key, spool_dir=spool_dir)
    warm = client.send(destination, {"warm": True}, biz_id="warm")  # the consumer group joined
    eventually(lambda: warm in subscriber.message_ids(), 30, "the first message")
    head_due = datetime.now(UTC) + timedelta(seconds=8)
    head = client.send(destination, {"n": 0}, biz_id="a", deliver_at=head_due)
    behind = client.send(destination, {"n": 1}, biz_id="a")
    other = client.send(destination, {"n": 2}, biz_id="b")
    assert client.close(30) == 0

    eventually(lambda: [d["status"] for d in bus.deliveries(head)] == ["scheduled"], 30,
               "the held head shown as scheduled")
    assert bus.admin.get(f"/v1/messages/{head}").json()["deliveries"][0]["scheduled_for"]

    eventually(lambda: subscriber.message_ids() >= {head, behind, other}, 30, "all three")
    order = [p.message_id for p in subscriber.pushes if p.message_id in (head, behind, other)]
    assert order == [other, head, behind], "key b waited, or key a's order broke"
    assert wall_time(subscriber.pushes[[p.message_id for p in subscriber.pushes].index(head)]
                     ) >= head_due


def _scheduled(bus: RunningBus, destination: str) -> list[dict[str, object]]:
    answer = bus.admin.get(f"/v1/destinations/{destination}/scheduled")
    assert answer.status_code == 200, answer.text
    return list(answer.json())


def test_an_operator_delivers_one_now_and_cancels_another_audited(
        bus: RunningBus, api_key: str, spool_dir: Path, unique: str) -> None:
    destination, subscriber = _setup(bus, unique, "rabbitmq")
    client = MsgbusClient(bus.receiver_url, api_key, spool_dir=spool_dir)
    now_one = client.send(destination, {"n": 1}, delay_s=3600)
    cancelled = client.send(destination, {"n": 2}, delay_s=3600)
    kept = client.send(destination, {"n": 3}, delay_s=3600)
    assert client.close(30) == 0
    eventually(lambda: len(_scheduled(bus, destination)) == 3, 30, "three scheduled")
    listed = _scheduled(bus, destination)
    assert {d["message_id"] for d in listed} == {now_one, cancelled, kept}
    assert all(d["subscription"] == f"{destination}/sub" and not d["held_in_place"]
               for d in listed)

    base = f"/v1/destinations/{destination}/subscriptions/sub/scheduled"
    answer = bus.admin.post(f"{base}/deliver-now",
                            json={"message_ids": [now_one], "requested_by": "ops-anna"})
    assert answer.status_code == 200 and answer.json()["delivered_now"] == 1
    answer = bus.admin.post(f"{base}/cancel", json={"message_ids": [cancelled],
                                                     "reason": "order withdrawn"})
    assert answer.status_code == 200 and answer.json()["cancelled"] == 1
    again = bus.admin.post(f"{base}/cancel", json={"message_ids": [cancelled],
                                                    "reason": "twice"})
    assert again.status_code == 409 and "scheduled" in again.json()["message"]
    assert bus.admin.post(f"{base}/cancel", json={"message_ids": [kept]}).status_code == 422

    eventually(lambda: now_one in subscriber.message_ids(), 30, "the one delivered now")
    assert subscriber.message_ids() == {now_one}
    # its outcome reaches MongoDB just after the push
    eventually(lambda: {d["message_id"] for d in _scheduled(bus, destination)} == {kept}, 30,
               "only the kept one scheduled")
    timeline = bus.admin.get(f"/v1/messages/{cancelled}").json()
    assert timeline["deliveries"][0]["status"] == DeliveryStatus.DISCARDED.value
    assert timeline["deliveries"][0]["discard_reason"] == "order withdrawn"
    audit = bus.admin.get("/v1/audit", params={"target": f"{destination}/sub"}).json()
    actions = {e["action"] for e in audit}
    assert {"scheduled.deliver_now", "scheduled.cancel"} <= actions

    page = bus.admin.get(f"/ui/destinations/{destination}/scheduled")
    assert page.status_code in (200, 303)  # the UI wants a session: see test_admin_ui


@pytest.mark.parametrize(("fields", "field"), [
    ({"delay_s": 31 * 24 * 3600}, "delay_s"),
    ({"deliver_at": "2026-11-27 10:00"}, "deliver_at"),
    ({"deliver_at": "2026-11-27T10:00:00Z", "delay_s": 1}, "delay_s"),
])
def test_the_receiver_answers_422_for_a_bad_delay(
        bus: RunningBus, api_key: str, unique: str, fields: dict[str, object],
        field: str) -> None:
    destination = f"delays-bad-{unique}"
    bus.create_destination(destination, "direct")
    bus.wait_for_config()
    answer = httpx.post(f"{bus.receiver_url}/v1/destinations/{destination}/messages",
                        json={"message_id": uuid7(), "body": {}, **fields},
                        headers={"authorization": f"Bearer {api_key}"}, timeout=10)
    assert answer.status_code == 422, answer.text
    assert answer.json()["field"] == field
    far = (datetime.now(UTC) + timedelta(days=31)).isoformat()
    batch = httpx.post(f"{bus.receiver_url}/v1/messages", json={"messages": [
        {"destination": destination, "message_id": uuid7(), "body": {}, "deliver_at": far}]},
        headers={"authorization": f"Bearer {api_key}"}, timeout=10)
    assert batch.status_code == 200 and batch.json()["results"][0]["status"] == 422
