"""Batch subscriptions on real services (receiver -> Kafka | RabbitMQ | direct -> dispatcher ->
a real HTTP subscriber; retries by the compensator; trace in MongoDB): every message arrives
once, in signed CloudEvents batches within the subscription's limits; a failed batch is retried
(as batches) until each of its messages is delivered, and each attempt on a message's timeline
names its batch; an ordered batch subscription keeps per-key order through failures."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from cloudevents.core.formats.json import JSONFormat
from msgbus_client.verify import verify_push
from msgbus_devtools.testkit.bus import RunningBus
from msgbus_devtools.testkit.sending import post_batches
from msgbus_devtools.testkit.subscriber import BatchPush, BatchSubscriber
from msgbus_devtools.testkit.waiting import eventually

from msgbus.ids import uuid7

pytestmark = pytest.mark.integration

FAST_RETRIES = {"delays_s": [0.2, 0.4]}
BATCH = "application/cloudevents-batch+json"


def send(bus: RunningBus, api_key: str, messages: list[dict[str, Any]]) -> list[str]:
    batch = [{"message_id": uuid7(), **m} for m in messages]
    post_batches(bus.receiver_url, api_key, batch, batch_size=100)
    return [m["message_id"] for m in batch]


def subscribe(bus: RunningBus, destination: str, subscriber: BatchSubscriber,
              **options: Any) -> str:
    """The subscription's signing secret, once the dispatcher runs its worker."""
    sub = bus.subscribe(destination, "batched", bus.serve_subscriber(subscriber), **options)
    bus.wait_for_workers([f"{destination}/batched"])
    return str(sub["signing_secrets"][0])


@pytest.mark.parametrize("broker", ["kafka", "rabbitmq", "direct"])
def test_every_message_arrives_once_in_signed_batches_within_the_limits(
        bus: RunningBus, api_key: str, unique: str, broker: str) -> None:
    destination = f"batches-{broker}-{unique}"
    bus.create_destination(destination, broker)
    subscriber = BatchSubscriber()
    secret = subscribe(bus, destination, subscriber, batch_max_messages=20,
                       batch_max_bytes=8192, batch_max_wait_ms=200)
    ids = send(bus, api_key, [{"destination": destination, "biz_id": f"k{i % 7}",
                               "body": {"n": i, "pad": "x" * (i % 5) * 200}}
                              for i in range(300)])
    eventually(lambda: set(ids) <= set(subscriber.delivered()), 60, "every message")

    pushes = subscriber.all_pushes()
    assert all(p.headers["content-type"] == BATCH for p in pushes)
    assert all(1 <= len(p.events) <= 20 and len(p.body) <= 8192 for p in pushes)
    assert max(len(p.events) for p in pushes) > 1, "never batched"
    assert subscriber.delivered() == dict.fromkeys(ids, 1), "each message exactly once"
    for push in pushes:
        verify_push(secret, push.headers, push.body)  # raises unless signed over the body
        for event in json.loads(push.body):
            parsed = JSONFormat().read(None, json.dumps(event))
            assert parsed.get_type() == destination and parsed.get_data()["n"] >= 0

    # a lone message does not wait for a batch to fill: it goes after the wait, alone
    [lone] = send(bus, api_key, [{"destination": destination, "body": {"n": -1}}])
    eventually(lambda: lone in subscriber.delivered(), 30, "the lone message")
    [carrier] = [p for p in subscriber.all_pushes() if lone in {e["id"] for e in p.events}]
    assert [e["id"] for e in carrier.events] == [lone]


def _fail_first_pushes(push: BatchPush, seen: set[str]) -> int:
    """500 for a push holding a message never pushed before; 200 for retries."""
    return 500 if any(e["id"] not in seen for e in push.events) else 200


def test_a_failed_batch_is_retried_until_delivered_and_the_timeline_names_each_batch(
        bus: RunningBus, api_key: str, unique: str) -> None:
    destination = f"batches-retry-{unique}"
    bus.create_destination(destination, "kafka")
    subscriber = BatchSubscriber(script=_fail_first_pushes)
    subscribe(bus, destination, subscriber, batch_max_messages=10, batch_max_wait_ms=50,
              retry_policy=FAST_RETRIES)
    ids = send(bus, api_key, [{"destination": destination, "body": {"n": i}} for i in range(60)])
    eventually(lambda: set(ids) <= set(subscriber.delivered()), 60, "every message delivered")
    assert subscriber.delivered() == dict.fromkeys(ids, 1)
    pushes = subscriber.all_pushes()
    assert all(p.headers["content-type"] == BATCH for p in pushes), "retries are batches too"
    carried = {(p.batch_id, e["id"]): p.status for p in pushes for e in p.events}

    def attempts_of(message_id: str) -> list[dict[str, Any]]:
        timeline = bus.admin.get(f"/v1/messages/{message_id}").json()
        [delivery] = timeline["deliveries"]
        return list(delivery["attempts_log"]) if delivery["status"] == "delivered" else []

    for message_id in ids[:10]:
        eventually(lambda m=message_id: len(attempts_of(m)) == 2, 30, "both attempts recorded")
        first, retry = sorted(attempts_of(message_id), key=lambda a: a["attempt"])
        assert carried[(first["batch_id"], message_id)] == 500 and not first["ok"]
        assert carried[(retry["batch_id"], message_id)] == 200 and retry["ok"]


class FlakyOrderedSubscriber(BatchSubscriber):
    """Fails a random fifth of the batch pushes; the log has, per push in the order they
    arrived, its (biz_id, n) events and its answer."""

    def __init__(self, seed: int) -> None:
        super().__init__(script=self._answer)
        self._random = random.Random(seed)
        self.log: list[tuple[list[tuple[str, int]], int]] = []

    def _answer(self, push: BatchPush, seen: set[str]) -> int:
        status = 500 if self._random.random() < 0.2 else 200
        self.log.append(([(e["bizid"], e["data"]["n"]) for e in push.events], status))
        return status


def assert_in_order(log: list[tuple[list[tuple[str, int]], int]], per_key: int) -> None:
    """Each push carries a key's next messages, in order, after its earlier ones succeeded
    (a batch may hold several of one key); every key ends with all its messages."""
    succeeded: dict[str, int] = {}
    for events, status in log:
        expected: dict[str, int] = {}
        for key, n in events:
            next_n = expected.get(key, succeeded.get(key, 0))
            assert n == next_n, (f"{key}: message {n} was pushed where {next_n} was due "
                                 f"(the earlier ones had not all succeeded)")
            expected[key] = n + 1
        if status == 200:
            succeeded |= expected
    assert set(succeeded.values()) == {per_key}


@pytest.mark.parametrize("broker", ["kafka", "rabbitmq"])
def test_an_ordered_batch_subscription_keeps_per_key_order_through_failures(
        bus: RunningBus, api_key: str, unique: str, broker: str) -> None:
    keys, per_key = 30, 20
    destination = f"batches-ordered-{broker}-{unique}"
    bus.create_destination(destination, broker)
    subscriber = FlakyOrderedSubscriber(seed=11)
    subscribe(bus, destination, subscriber, ordered_by_biz_id=True, max_concurrency=4,
              batch_max_messages=25, batch_max_wait_ms=20, retry_policy=FAST_RETRIES)
    send(bus, api_key, [{"destination": destination, "biz_id": f"key-{k}", "body": {"n": n}}
                        for n in range(per_key) for k in range(keys)])
    eventually(lambda: len(subscriber.delivered()) >= keys * per_key, 120,
               "every message delivered")

    assert_in_order(list(subscriber.log), per_key)
    assert len({key for events, _ in subscriber.log for key, _ in events}) == keys
    assert any(status == 500 for _, status in subscriber.log), "no failure: proved nothing"
    assert max(len(events) for events, _ in subscriber.log) > 1, "never batched"


def test_the_admin_test_push_to_a_batch_subscription_is_a_batch(
        bus: RunningBus, unique: str) -> None:
    destination = f"batches-test-push-{unique}"
    bus.create_destination(destination, "direct")
    subscriber = BatchSubscriber()
    secret = subscribe(bus, destination, subscriber, batch_max_messages=50)
    answer = bus.admin.post(f"/v1/destinations/{destination}/subscriptions/batched/test")
    assert answer.status_code == 200 and answer.json()["ok"], answer.text
    [push] = subscriber.all_pushes()
    verify_push(secret, push.headers, push.body)
    assert [e["id"] for e in push.events] == [answer.json()["message_id"]]


@pytest.mark.parametrize(("settings", "says"), [
    ({"batch_max_messages": 0}, "batch_max_messages"),
    ({"batch_max_messages": 5000}, "batch_max_messages"),
    ({"batch_max_bytes": 10}, "batch_max_bytes"),
    ({"batch_max_wait_ms": -5}, "batch_max_wait_ms"),
    ({"batch_max_messages": 500, "max_in_flight": 100}, "must be at least batch_max_messages"),
])
def test_bad_batch_settings_are_refused_with_what_is_wrong(
        bus: RunningBus, unique: str, settings: dict[str, Any], says: str) -> None:
    destination = f"batches-bad-{unique}"
    bus.create_destination(destination, "direct")
    answer = bus.admin.put(f"/v1/destinations/{destination}/subscriptions/s",
                           json={"url": "http://127.0.0.1:9/hook", **settings})
    assert answer.status_code == 422
    assert says in answer.text
