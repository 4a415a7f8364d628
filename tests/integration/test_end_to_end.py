"""The whole path on real services: client (LMDB spool) -> receiver -> Kafka | RabbitMQ |
direct -> dispatcher -> two real HTTP subscribers, with the trace in MongoDB."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from msgbus_client import MsgbusClient
from msgbus_client.verify import verify_push
from msgbus_devtools.testkit.bus import RunningBus, sample_value
from msgbus_devtools.testkit.subscriber import RecordingSubscriber
from msgbus_devtools.testkit.waiting import eventually

from msgbus.models import CircuitPolicy, DeliveryStatus

MESSAGES = 400
BIZ_KEYS = 50


def _setup(bus: RunningBus, unique: str, broker: str,
           statuses: tuple[int, int] = (200, 200)) -> tuple[str, list[RecordingSubscriber],
                                                           list[dict[str, object]]]:
    destination = f"orders-{broker}-{unique}"
    bus.create_destination(destination, broker)
    subscribers = [RecordingSubscriber(status=s) for s in statuses]
    subs = [bus.subscribe(destination, f"sub{i}", bus.serve_subscriber(s))
            for i, s in enumerate(subscribers)]
    bus.wait_for_workers([f"{destination}/sub{i}" for i in range(len(subscribers))])
    return destination, subscribers, subs


def _send_all(bus: RunningBus, api_key: str, spool_dir: Path, destination: str) -> list[str]:
    client = MsgbusClient(bus.receiver_url, api_key, spool_dir=spool_dir)
    ids = [client.send(destination, {"n": i, "item": "book"},
                       biz_id=f"{destination}-order-{i % BIZ_KEYS}")
           for i in range(MESSAGES)]
    assert client.close(30) == 0, "the receiver did not accept every message"
    return ids


def _delivered_with_trace(bus: RunningBus, sub_id: str) -> int:
    return int(bus.query(bus.store.progress.count_deliveries(sub_id, DeliveryStatus.DELIVERED)))


@pytest.mark.parametrize("broker", ["kafka", "rabbitmq", "direct"])
def test_end_to_end_every_message_reaches_both_subscribers_and_is_traced(
        bus: RunningBus, api_key: str, spool_dir: Path, unique: str, broker: str) -> None:
    destination, subscribers, subs = _setup(bus, unique, broker)
    ids = _send_all(bus, api_key, spool_dir, destination)

    for i, subscriber in enumerate(subscribers):
        eventually(lambda s=subscriber: s.message_ids() >= set(ids), 60,
                   f"subscriber {i} to receive all {MESSAGES} messages")
    for sub in subs:
        sub_id = f"{destination}/{sub['name']}"
        eventually(lambda s=sub_id: _delivered_with_trace(bus, s) == MESSAGES, 60,
                   f"MongoDB to show {MESSAGES} deliveries to {sub_id}")
        with_trace = bus.query(bus.store.db.deliveries.count_documents(
            {"subscription": sub_id, "status": "delivered", "last_status_code": 200,
             "last_latency_ms": {"$gt": 0}}))
        assert with_trace == MESSAGES
        attempts = bus.query(bus.store.db.attempts.distinct(
            "message_id", {"subscription": sub_id, "status_code": 200,
                           "latency_ms": {"$gt": 0}, "attempt": 1}))
        assert set(attempts) == set(ids)

    # every push is signed with the subscription's secret and carries the ids
    push = subscribers[0].pushes[0]
    verify_push(str(subs[0]["signing_secrets"][0]), push.headers, push.body)  # type: ignore[index]
    assert push.headers["ce-type"] == destination
    assert push.headers["ce-bizid"].startswith(f"{destination}-order-")

    found = bus.query(bus.store.traces.find_messages(biz_id=f"{destination}-order-7", limit=1000))
    assert {m["_id"] for m in found} == {ids[i] for i in range(7, MESSAGES, BIZ_KEYS)}
    assert all(m["destination"] == destination for m in found)


@pytest.mark.parametrize("broker", ["kafka", "direct"])
def test_failing_subscriber_is_recorded_failed_while_the_other_gets_everything(
        bus: RunningBus, api_key: str, spool_dir: Path, unique: str, broker: str) -> None:
    """The broken subscriber's failures are recorded for the compensator; after
    CircuitPolicy().open_after_failures of them its circuit opens and the rest of its messages wait
    (pending) instead of being pushed at a subscriber that only fails."""
    destination, (healthy, broken), _ = _setup(bus, unique, broker, statuses=(200, 500))
    client = MsgbusClient(bus.receiver_url, api_key, spool_dir=spool_dir)
    ids = [client.send(destination, {"n": i}) for i in range(200)]
    assert client.close(30) == 0

    eventually(lambda: healthy.message_ids() >= set(ids), 60, "the healthy subscriber")
    failed_id = f"{destination}/sub1"
    progress = bus.store.progress
    eventually(lambda: bus.query(progress.count_deliveries(failed_id, DeliveryStatus.FAILED))
               >= CircuitPolicy().open_after_failures, 60, "the first failed deliveries in MongoDB")
    failed = bus.query(progress.deliveries_by_status(failed_id, DeliveryStatus.FAILED, 1000))
    assert all(d["last_status_code"] == 500 and d["next_attempt_at"] is not None
               for d in failed)
    assert {d["message_id"] for d in failed} <= broken.message_ids() <= set(ids)
    assert len(broken.pushes) < len(ids) / 2, "pushes went on at a subscriber that only fails"
    metrics = httpx.get(f"{bus.dispatcher_url}/metrics", timeout=10).text
    assert sample_value(metrics, "msgbus_subscription_circuit_open",
                        {"subscription": failed_id, "component": "dispatcher"}) == 1

    def backlog_shown() -> bool:
        text = httpx.get(f"{bus.dispatcher_url}/metrics", timeout=10).text
        labels = {"subscription": failed_id}
        return (sample_value(text, "msgbus_subscription_backlog", labels) > 0
                and sample_value(text, "msgbus_subscription_oldest_undelivered_age_seconds",
                                 labels) > 0)

    eventually(backlog_shown, 30, "the broken subscription's backlog and oldest age")

    def admin_shows_it_open() -> bool:  # the admin shows who pushes, and the one circuit
        view = bus.admin.get(f"/v1/destinations/{destination}/subscriptions/sub1/pushers").json()
        components = {p["component"] for p in view["pushers"] if p["circuit_open"]}
        return view["circuit_open"] and components >= {"dispatcher"}

    eventually(admin_shows_it_open, 30, "the admin showing the subscription's circuit open")

    # its pushers wait for the next probe; pausing it must not wait for that
    bus.admin.post(f"/v1/destinations/{destination}/subscriptions/sub1/pause").raise_for_status()
    eventually(lambda: failed_id not in httpx.get(f"{bus.dispatcher_url}/health").json()[
        "subscriptions"], 5, "the broken subscription's worker to stop")
    eventually(lambda: _delivered_with_trace(bus, f"{destination}/sub0") == len(ids), 60,
               "the healthy subscriber's deliveries recorded")
