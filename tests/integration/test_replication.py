"""Copies of every message, set and shown, on the real brokers: Kafka topics are created with
the replication factor and min.insync.replicas asked for (tansu echoes what it was sent: it
runs one broker, docs/decisions.md), RabbitMQ quorum queues carry a subscription end to end,
and a classic queue where quorum was asked for is kept, served, and shown as an alert by the
admin (API and UI) and the broker-health monitor."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pika
import pytest
from confluent_kafka.admin import NewTopic
from msgbus_client import MsgbusClient
from msgbus_devtools import servers as services
from msgbus_devtools.testkit.bus import RunningBus, sample_value
from msgbus_devtools.testkit.waiting import eventually

from dispatcher.brokerhealth import BrokerHealthMonitor
from msgbus.brokers.base import consumer_name, topic_name
from msgbus.brokers.kafka import KafkaPublisher
from msgbus.models import BrokerKind, Destination, Subscription
from msgbus.replication import Wanted, describe_topic, kafka_admin
from msgbus.settings import ConnectionSettings

pytestmark = pytest.mark.integration

MESSAGES = 200


@pytest.fixture(scope="module")
def quorum_bus(start_bus: Any, rabbitmq_management: str) -> Iterator[RunningBus]:
    """A bus whose settings ask for quorum queues, three Kafka replicas and two in sync."""
    with start_bus("quorum", rabbitmq_queue_type="quorum", kafka_replication_factor=3,
                   kafka_min_insync_replicas=2) as running:
        yield running


def management_queue(name: str) -> dict[str, Any]:
    response = httpx.get(f"{services.RABBITMQ_MANAGEMENT_URL}/api/queues/%2F/{name}",
                         auth=("guest", "guest"), timeout=5)
    response.raise_for_status()
    found: dict[str, Any] = response.json()
    return found


def send(bus: RunningBus, spool_dir: Path, destination: str) -> list[str]:
    client = MsgbusClient(bus.receiver_url, bus.create_app(f"app-{uuid.uuid4().hex[:6]}"),
                          spool_dir=spool_dir)
    ids = [client.send(destination, {"n": i}, biz_id=f"key-{i % 10}") for i in range(MESSAGES)]
    assert client.close(30) == 0, "the receiver did not accept every message"
    return ids


def poll(monitor: BrokerHealthMonitor) -> str:
    async def once() -> None:
        try:
            await monitor.poll_once()
        finally:
            await monitor.close()

    asyncio.run(once())
    from prometheus_client import REGISTRY, generate_latest

    return generate_latest(REGISTRY).decode()


# -- Kafka ---------------------------------------------------------------------------------------

async def test_kafka_topics_are_created_with_the_copies_asked_for(kafka_bootstrap: str) -> None:
    """What the publisher sends in CreateTopics is what the broker describes afterwards; with
    nothing asked for, nothing is sent and the broker's defaults apply."""
    code = f"copies-{uuid.uuid4().hex[:8]}"
    asked = KafkaPublisher(kafka_bootstrap, replication_factor=3, min_insync_replicas=2)
    plain = KafkaPublisher(kafka_bootstrap)
    for publisher, suffix in ((asked, "asked"), (plain, "default")):
        await publisher.start()
        try:
            await publisher.ensure_topology(Destination(code=f"{code}-{suffix}",
                                                        broker=BrokerKind.KAFKA), [])
        finally:
            await publisher.close()
    admin = kafka_admin(kafka_bootstrap)
    wanted = Wanted(kafka_replication_factor=3, kafka_min_insync_replicas=2)
    described = describe_topic(admin, topic_name(f"{code}-asked"), wanted)
    assert (described.exists, described.partitions, described.replication_factor,
            described.fewest_in_sync, described.min_insync_replicas) == (True, 4, 3, 3, 2)
    assert described.problems == []
    default = describe_topic(admin, topic_name(f"{code}-default"), Wanted())
    assert (default.replication_factor, default.min_insync_replicas) == (1, None)
    assert default.problems == []
    assert asked.new_topic("t", 4).replication_factor == 3
    assert plain.new_topic("t", 4).replication_factor == -1  # the broker's default


def test_an_under_replicated_topic_is_an_alert(kafka_bootstrap: str,
                                               caplog: pytest.LogCaptureFixture) -> None:
    """A topic made before the settings asked for three copies keeps one: the monitor's gauge
    reads 1 and it warns, once."""
    code = f"under-{uuid.uuid4().hex[:8]}"
    topic = topic_name(code)
    admin = kafka_admin(kafka_bootstrap)
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result(10)
    conn = ConnectionSettings(kafka_bootstrap=kafka_bootstrap, kafka_replication_factor=3,
                              kafka_min_insync_replicas=2)
    sub = Subscription(destination=code, name="s", url="http://127.0.0.1:9/hook")
    with caplog.at_level(logging.WARNING, logger="dispatcher.copies"):
        text = poll(BrokerHealthMonitor(conn, lambda: [(sub, BrokerKind.KAFKA)], interval_s=1))
    labels = {"cluster": "default", "destination": code}
    assert sample_value(text, "msgbus_kafka_topic_under_replicated", labels) == 1
    assert sample_value(text, "msgbus_kafka_topic_replicas",
                        {**labels, "what": "replication_factor"}) == 1
    warned = [r.getMessage() for r in caplog.records if topic in r.getMessage()]
    assert len(warned) == 1
    assert "1 replica(s) per partition, 3 asked for" in warned[0]
    assert "min.insync.replicas not described, 2 asked for" in warned[0]


# -- RabbitMQ ------------------------------------------------------------------------------------

def test_a_quorum_queue_carries_a_subscription_end_to_end(quorum_bus: RunningBus,
                                                          tmp_path: Path) -> None:
    """receiver -> RabbitMQ quorum queue -> dispatcher -> a real HTTP subscriber; the admin
    shows the queue as the management API describes it."""
    bus = quorum_bus
    code = f"quorum-{uuid.uuid4().hex[:8]}"
    bus.create_destination(code, "rabbitmq")
    subscriber = bus.subscribe_recorder(code, "s")
    ids = send(bus, tmp_path / "spool", code)
    eventually(lambda: subscriber.message_ids() >= set(ids), 60,
               f"the subscriber to receive all {MESSAGES} messages")

    queue = management_queue(consumer_name(code, "s"))
    assert queue["type"] == "quorum" and queue["arguments"] == {"x-queue-type": "quorum"}
    report = bus.admin.get(f"/v1/destinations/{code}/replication").json()
    assert report["wanted"]["rabbitmq_queue_type"] == "quorum"
    [cluster] = report["clusters"]
    [shown] = cluster["queues"]
    assert (shown["type"], shown["members"], shown["online"]) == (
        "quorum", queue["members"], queue["online"])
    assert shown["members"] and report["problems"] == []


def test_a_classic_queue_where_quorum_is_asked_for_is_kept_and_shown(
        quorum_bus: RunningBus, rabbitmq_url: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    """A queue that exists as classic cannot become quorum (PRECONDITION_FAILED): the bus keeps
    using it, delivers everything, and the admin and the monitor report the mismatch."""
    bus = quorum_bus
    code = f"classic-{uuid.uuid4().hex[:8]}"
    queue = consumer_name(code, "s")
    with pika.BlockingConnection(pika.URLParameters(rabbitmq_url)) as connection:
        connection.channel().queue_declare(queue, durable=True)  # classic, as before
    bus.create_destination(code, "rabbitmq")
    with caplog.at_level(logging.WARNING, logger="msgbus.brokers._rabbit_consumer"):
        subscriber = bus.subscribe_recorder(code, "s")
        ids = send(bus, tmp_path / "spool", code)
        eventually(lambda: subscriber.message_ids() >= set(ids), 60,
                   f"the subscriber to receive all {MESSAGES} messages")
    assert any(f"rabbitmq queue {queue} exists as" in r.getMessage() for r in caplog.records)
    assert management_queue(queue)["type"] == "classic"

    report = bus.admin.get(f"/v1/destinations/{code}/replication").json()
    expected = f"queue {queue}: classic (one copy) where quorum was asked for"
    assert report["problems"] == [f"default: {expected}"]
    listed = bus.admin.get("/ui/destinations")
    assert f'href="/ui/destinations/{code}/replication"' in listed.text
    page = bus.admin.get(f"/ui/destinations/{code}/replication")
    assert page.status_code == 200 and expected in page.text

    sub = Subscription(destination=code, name="s", url="http://127.0.0.1:9/hook")
    text = poll(BrokerHealthMonitor(bus.connections, lambda: [(sub, BrokerKind.RABBITMQ)],
                                    interval_s=1))
    assert sample_value(text, "msgbus_rabbitmq_queue_copies_mismatch",
                        {"cluster": "default", "subscription": sub.id}) == 1


def test_the_replication_of_an_unknown_destination_is_a_404(quorum_bus: RunningBus) -> None:
    response = quorum_bus.admin.get("/v1/destinations/no-such-thing/replication")
    assert response.status_code == 404
    assert "no-such-thing" in response.text
