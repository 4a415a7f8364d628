"""Broker health metrics (dispatcher/brokerhealth.py) read off the real brokers: RabbitMQ's
management API (nodes, alarms, flow control, a subscription's queue depth) and a Kafka consumer
group's committed offsets and lag on tansu; an unreachable cluster reads as down."""

from __future__ import annotations

import asyncio
import uuid

import pika
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from msgbus_devtools import servers as services
from msgbus_devtools.testkit.bus import sample_value
from msgbus_devtools.testkit.waiting import eventually

from dispatcher.brokerhealth import BrokerHealthMonitor
from msgbus.brokers.base import consumer_name, topic_name
from msgbus.brokers.management import management_url
from msgbus.models import BrokerKind, Subscription
from msgbus.settings import ConnectionSettings

pytestmark = pytest.mark.integration


def exposition() -> str:
    from prometheus_client import REGISTRY, generate_latest

    return generate_latest(REGISTRY).decode()


def poll(monitor: BrokerHealthMonitor) -> str:
    asyncio.run(_poll_and_close(monitor))
    return exposition()


async def _poll_and_close(monitor: BrokerHealthMonitor) -> None:
    try:
        await monitor.poll_once()
    finally:
        await monitor.close()


def subscription(destination: str, name: str) -> Subscription:
    return Subscription(destination=destination, name=name, url="http://127.0.0.1:9/hook")


def test_management_url_is_derived_from_the_amqp_node() -> None:
    assert management_url("amqp://u%40x:p%2Fw@mq-1.example:5672/%2F") == (
        "http://mq-1.example:15672", ("u@x", "p/w"))
    assert management_url("amqps://mq:5671/")[0] == "https://mq:15672"


def test_rabbitmq_nodes_and_a_subscriptions_queue_depth(rabbitmq_url: str,
                                                         rabbitmq_management: str) -> None:
    sub = subscription(f"health-{uuid.uuid4().hex[:8]}", "s")
    queue = consumer_name(sub.destination, sub.name)
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    try:
        channel = connection.channel()
        channel.queue_declare(queue, durable=False, auto_delete=False)
        for n in range(3):
            channel.basic_publish("", queue, f"m{n}".encode())
        conn = ConnectionSettings(rabbitmq_url=rabbitmq_url)

        def depth() -> float:  # the management API's queue figures lag a few seconds
            text = poll(BrokerHealthMonitor(
                conn, lambda: [(sub, BrokerKind.RABBITMQ)], interval_s=1))
            assert sample_value(text, "msgbus_broker_up",
                                {"broker": "rabbitmq", "cluster": "default"}) == 1
            return sample_value(text, "msgbus_rabbitmq_queue_messages",
                                {"subscription": sub.id, "state": "ready"})

        eventually(lambda: depth() == 3, 30, "the queue depth of 3 in the management API",
                   interval_s=1.0)
        text = exposition()
        assert sample_value(text, "msgbus_rabbitmq_node_running", {"cluster": "default"}) >= 1
        assert sample_value(text, "msgbus_rabbitmq_node_memory_used_bytes",
                            {"cluster": "default"}) > 0
        assert "msgbus_rabbitmq_node_memory_alarm{" in text
        assert "msgbus_rabbitmq_flow_controlled_connections{" in text
    finally:
        connection.channel().queue_delete(queue)
        connection.close()


def test_kafka_consumer_position_and_lag_of_a_subscription(kafka_bootstrap: str) -> None:
    sub = subscription(f"health-{uuid.uuid4().hex[:8]}", "s")
    topic = topic_name(sub.destination)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(10)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for n in range(5):
        producer.produce(topic, f"m{n}".encode(), partition=0)
        producer.flush(10)  # one batch per record: the end offset counts records here
    group = Consumer({"bootstrap.servers": kafka_bootstrap,
                      "group.id": consumer_name(sub.destination, sub.name),
                      "enable.auto.commit": False})
    try:
        group.commit(offsets=[TopicPartition(topic, 0, 2)], asynchronous=False)
    finally:
        group.close()
    conn = ConnectionSettings(kafka_bootstrap=kafka_bootstrap)
    text = poll(BrokerHealthMonitor(conn, lambda: [(sub, BrokerKind.KAFKA)], interval_s=1))
    assert sample_value(text, "msgbus_broker_up", {"broker": "kafka", "cluster": "default"}) == 1
    assert sample_value(text, "msgbus_kafka_consumer_committed_offset",
                        {"subscription": sub.id, "partition": "0"}) == 2
    assert sample_value(text, "msgbus_kafka_consumer_lag_messages",
                        {"subscription": sub.id}) == 3


def test_an_unreachable_cluster_reads_as_down_and_mongo_ping_is_reported() -> None:
    dead = services.free_port()
    conn = ConnectionSettings(rabbitmq_clusters={"gone": [f"amqp://127.0.0.1:{dead}/"]},
                              rabbitmq_management_urls={"gone": f"http://127.0.0.1:{dead}"})

    async def down() -> bool:
        return False

    text = poll(BrokerHealthMonitor(conn, list, interval_s=1, mongo_ping=down,
                                    service="test-deploy"))
    assert "msgbus_broker_up{broker=\"rabbitmq\",cluster=\"gone\"} 0.0" in text
    assert "msgbus_mongo_up{service=\"test-deploy\"} 0.0" in text

