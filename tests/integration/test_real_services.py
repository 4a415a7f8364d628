"""The session's real servers work, and the dev stack goes up and down."""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path

import pika
import pytest
from confluent_kafka import Consumer, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from msgbus_devtools import servers as services
from msgbus_devtools import stack as devstack
from msgbus_devtools.testkit.waiting import eventually
from pymongo import MongoClient

from msgbus import processes

pytestmark = pytest.mark.integration


def consume_one(consumer: Consumer, deadline_s: float) -> Message:
    got: list[Message] = []  # a Message with an empty value is falsy

    def one() -> bool:
        message = consumer.poll(0.5)  # waits up to 0.5 s itself
        if message is not None and message.error() is None:
            got.append(message)
        return bool(got)

    eventually(one, deadline_s, "a message", interval_s=0)
    return got[0]


def test_kafka_produce_and_consume(kafka_bootstrap: str) -> None:
    topic = f"t-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1)])[topic].result(10)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "acks": "all"})
    producer.produce(topic, key=b"k", value=b"hello")
    assert producer.flush(10) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": f"g-{topic}",
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
        }
    )
    try:
        consumer.subscribe([topic])
        message = consume_one(consumer, deadline_s=30)
    finally:
        consumer.close()
    assert (message.key(), message.value()) == (b"k", b"hello")


def test_mongo_insert_and_find(mongo_uri: str, mongo_db_name: str) -> None:
    client: MongoClient[dict[str, object]] = MongoClient(mongo_uri, serverSelectionTimeoutMS=5000)
    try:
        collection = client[mongo_db_name]["things"]
        collection.insert_one({"_id": "a", "n": 1})
        assert collection.find_one({"_id": "a"}) == {"_id": "a", "n": 1}
    finally:
        client.close()


def test_mongo_db_names_differ_per_test(mongo_db_name: str) -> None:
    assert mongo_db_name.startswith("test_")


def test_rabbitmq_publish_and_get(rabbitmq_url: str) -> None:
    queue = f"msgbus-test-{uuid.uuid4().hex[:8]}"
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    try:
        channel = connection.channel()
        channel.queue_declare(queue, auto_delete=True)
        channel.basic_publish("", queue, b"hello")
        _, _, body = eventually(
            lambda: (got := channel.basic_get(queue, auto_ack=True))[0] is not None and got,
            10, "the message back from RabbitMQ")
        assert body == b"hello"
        channel.queue_delete(queue)
    finally:
        connection.close()


def test_dev_stack_up_status_down(tmp_path: Path, rabbitmq_url: str) -> None:
    kafka_port, mongo_port = services.free_port(), services.free_port()

    first = devstack.up(tmp_path, kafka_port=kafka_port, mongo_port=mongo_port)
    assert all(state.up for state in first), first
    pids = {state.name: state.pid for state in first if state.pid}
    assert services.mongo_ping(f"mongodb://127.0.0.1:{mongo_port}")
    env = (tmp_path / devstack.ENV_FILE).read_text()
    assert f"MSGBUS_KAFKA_BOOTSTRAP=127.0.0.1:{kafka_port}\n" in env
    assert f"MSGBUS_MONGO_URI=mongodb://127.0.0.1:{mongo_port}\n" in env
    assert f"MSGBUS_RABBITMQ_URL={rabbitmq_url}\n" in env

    again = devstack.up(tmp_path, kafka_port=kafka_port, mongo_port=mongo_port)
    assert {state.name: state.pid for state in again if state.pid} == pids  # reused, not restarted

    assert sorted(devstack.down(tmp_path)) == ["secantus", "tansu"]
    assert not any(processes.pid_alive(pid) for pid in pids.values())
    after = {state.name: state.up for state in devstack.status(tmp_path)}
    assert after == {"tansu": False, "secantus": False, "rabbitmq": True}
    assert not (tmp_path / devstack.STATE_FILE).exists()


def test_a_niced_secantus_serves_at_the_lower_cpu_priority(tmp_path: Path) -> None:
    """Its threads too: the handler threads it starts later inherit the priority."""
    server = services.start_secantus(services.free_port(), tmp_path / "data", tmp_path,
                                     nice=19)
    try:
        assert services.mongo_ping(server.url)  # the pid is SecantusDB's own, not nice's
        assert "secantusd" in Path(f"/proc/{server.pid}/cmdline").read_text()
        own = os.getpriority(os.PRIO_PROCESS, 0)
        priorities = []
        for thread in Path(f"/proc/{server.pid}/task").iterdir():
            with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
                priorities.append(os.getpriority(os.PRIO_PROCESS, int(thread.name)))
        assert priorities and set(priorities) == {min(own + 19, 19)}
    finally:
        server.stop()
