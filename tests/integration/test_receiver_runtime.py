"""What operators change while the bus runs, without a restart: a destination's broker, the
MongoDB record rate, and the active cluster of a broker kind (primary/standby), plus
reconnection across a cluster's nodes."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import orjson
import pika
import pytest
from msgbus_client import MsgbusClient
from msgbus_devtools import servers as services
from msgbus_devtools.testkit.bus import RunningBus
from msgbus_devtools.testkit.loop import BackgroundLoop
from msgbus_devtools.testkit.sending import post_batches
from msgbus_devtools.testkit.subscriber import RecordingSubscriber
from msgbus_devtools.testkit.tcp_gate import TcpGate
from msgbus_devtools.testkit.waiting import eventually

from msgbus.brokers.base import consumer_name
from msgbus.ids import uuid7
from msgbus_cli.asgi import answer_lifespan, read_body, request_headers, respond

STANDBY_VHOST = "msgbus-standby"


def _send(bus: RunningBus, api_key: str, spool: Path, destination: str, count: int) -> list[str]:
    client = MsgbusClient(bus.receiver_url, api_key, spool_dir=spool)
    ids = [client.send(destination, {"n": i}) for i in range(count)]
    assert client.close(30) == 0, "the receiver did not accept every message"
    return ids


def _rabbit_depth(url: str, queue: str) -> int:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        return int(connection.channel().queue_declare(queue, passive=True).method.message_count)
    finally:
        connection.close()


def _recorded(bus: RunningBus, destination: str) -> int:
    return int(bus.query(bus.store.db.messages.count_documents({"destination": destination})))


def test_switching_a_destination_broker_delivers_what_the_old_broker_still_holds(
        bus: RunningBus, api_key: str, rabbitmq_url: str, tmp_path: Path, unique: str) -> None:
    destination = f"switch-{unique}"
    bus.create_destination(destination, "rabbitmq")
    subscriber = RecordingSubscriber()
    bus.subscribe(destination, "sub", bus.serve_subscriber(subscriber), paused=True)
    queue = consumer_name(destination, "sub")
    bus.wait_for_config()  # the receiver declares the subscription's queue

    in_rabbit = _send(bus, api_key, tmp_path / "spool1", destination, 100)
    eventually(lambda: _rabbit_depth(rabbitmq_url, queue) == 100, 30,
               "100 messages waiting in RabbitMQ for the paused subscription")

    bus.create_destination(destination, "kafka")  # switched while messages wait in RabbitMQ
    bus.wait_for_config()
    in_kafka = _send(bus, api_key, tmp_path / "spool2", destination, 100)
    eventually(lambda: _recorded(bus, destination) == 200, 30, "200 records")
    assert _rabbit_depth(rabbitmq_url, queue) == 100, "the switch did not take effect"

    bus.subscribe(destination, "sub", bus.serve_subscriber(subscriber), paused=False)
    try:
        eventually(lambda: subscriber.message_ids() >= set(in_rabbit + in_kafka), 60,
                   "the subscriber to get the messages of both brokers")
    except AssertionError:
        got = subscriber.message_ids()
        raise AssertionError(f"missing {len(set(in_rabbit) - got)} of RabbitMQ's, "
                             f"{len(set(in_kafka) - got)} of Kafka's") from None
    eventually(lambda: _rabbit_depth(rabbitmq_url, queue) == 0, 30, "RabbitMQ drained")


def test_the_record_rate_can_be_changed_at_runtime_per_destination_and_globally(
        bus: RunningBus, api_key: str, tmp_path: Path, unique: str) -> None:
    slow, other = f"slow-{unique}", f"other-{unique}"
    bus.create_destination(slow, "direct", record_rate_per_s=2)
    bus.create_destination(other, "direct")
    bus.wait_for_config()

    _send(bus, api_key, tmp_path / "spool1", slow, 200)
    _send(bus, api_key, tmp_path / "spool2", other, 200)
    eventually(lambda: _recorded(bus, other) == 200, 30, "the unthrottled destination")
    assert _recorded(bus, slow) < 100, "the slow destination was not held to its rate"
    assert bus.receiver_metric("msgbus_record_rate_limit_per_second", destination=slow) == 2

    bus.create_destination(slow, "direct", record_rate_per_s=0)  # lifted at runtime
    eventually(lambda: _recorded(bus, slow) == 200, 30, "the backlog to be flushed once lifted")

    bus.admin.patch("/v1/runtime", json={"record_rate_per_s": 3}).raise_for_status()
    bus.wait_for_config()
    try:
        _send(bus, api_key, tmp_path / "spool3", other, 200)
        time.sleep(2)  # the rate's observation window: time passing is the scenario
        assert _recorded(bus, other) < 200 + 100, "the global rate was not applied"
    finally:
        bus.admin.patch("/v1/runtime", json={"record_rate_per_s": 0}).raise_for_status()
    eventually(lambda: _recorded(bus, other) == 400, 30, "the backlog once lifted")


# --- clusters -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def standby_vhost(rabbitmq_url: str) -> str:
    """A second RabbitMQ "cluster": a vhost of the machine's server (one server, two
    independent sets of exchanges and queues)."""
    ctl = services.rabbitmq_tool("rabbitmqctl")
    assert ctl, "rabbitmqctl is needed to create the standby vhost"
    subprocess.run([ctl, "add_vhost", STANDBY_VHOST], capture_output=True, timeout=60)
    subprocess.run([ctl, "set_permissions", "-p", STANDBY_VHOST, "guest", ".*", ".*", ".*"],
                   check=True, capture_output=True, timeout=60)
    return rabbitmq_url.rstrip("/").rsplit("/", 1)[0] + "/" + quote(STANDBY_VHOST, safe="")


@pytest.fixture(scope="module")
def primary_gate(rabbitmq_url: str) -> Iterator[TcpGate]:
    """The primary cluster's first node: the real server behind a gate the test can close."""
    port = pika.URLParameters(rabbitmq_url).port
    with TcpGate("127.0.0.1", port) as gate:
        yield gate


@pytest.fixture(scope="module")
def cluster_bus(mongo_uri: str, rabbitmq_url: str, standby_vhost: str, primary_gate: TcpGate,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBus]:
    params = pika.URLParameters(rabbitmq_url)
    gated = f"amqp://guest:guest@127.0.0.1:{primary_gate.port}/%2F"
    direct = f"amqp://guest:guest@127.0.0.1:{params.port}/%2F"
    loop = BackgroundLoop()
    running = RunningBus(
        loop, mongo_uri=mongo_uri, mongo_db=f"clusters_{uuid.uuid4().hex[:8]}",
        state_dir=tmp_path_factory.mktemp("cluster-bus"),
        rabbitmq_clusters={"primary": [gated, direct], "standby": [standby_vhost]},
    ).start()
    yield running
    running.close()
    loop.close()


def _published(bus: RunningBus, cluster: str) -> float:
    return bus.receiver_metric("msgbus_published_total", broker="rabbitmq", cluster=cluster,
                               outcome="ok")


def test_the_active_cluster_switches_at_runtime_and_nothing_is_lost(
        cluster_bus: RunningBus, tmp_path: Path) -> None:
    bus = cluster_bus
    api_key = bus.create_app(f"clusters-{uuid.uuid4().hex[:6]}")
    destination = "dc-orders"
    bus.create_destination(destination, "rabbitmq")
    subscriber = bus.subscribe_recorder(destination, "sub")

    on_primary = _send(bus, api_key, tmp_path / "spool1", destination, 50)
    eventually(lambda: subscriber.message_ids() >= set(on_primary), 30, "primary deliveries")
    # the counter moves once the broker confirmed, which may come after the push
    eventually(lambda: _published(bus, "primary") >= 50, 10, "50 publishes counted on primary")
    assert _published(bus, "standby") == 0

    wrong = bus.admin.patch("/v1/runtime", json={"active_clusters": {"rabbitmq": "nowhere"}})
    assert wrong.status_code == 422 and "primary, standby" in wrong.json()["message"]

    switched = bus.admin.patch("/v1/runtime", json={"active_clusters": {"rabbitmq": "standby"}})
    switched.raise_for_status()
    assert switched.json()["active_clusters"] == {"rabbitmq": "standby"}
    bus.wait_for_config()
    on_standby = _send(bus, api_key, tmp_path / "spool2", destination, 50)
    eventually(lambda: subscriber.message_ids() >= set(on_standby), 30, "standby deliveries")
    eventually(lambda: _published(bus, "standby") >= 50, 10, "50 publishes counted on standby")


def test_the_publisher_moves_to_the_next_node_when_one_goes_away(
        cluster_bus: RunningBus, primary_gate: TcpGate, tmp_path: Path) -> None:
    bus = cluster_bus
    bus.admin.patch("/v1/runtime", json={"active_clusters": {"rabbitmq": "primary"}})
    api_key = bus.create_app(f"failover-{uuid.uuid4().hex[:6]}")
    destination = "dc-failover"
    bus.create_destination(destination, "rabbitmq")
    subscriber = bus.subscribe_recorder(destination, "sub")
    bus.wait_for_config()

    before = _published(bus, "primary")
    first = _send(bus, api_key, tmp_path / "spool1", destination, 20)
    eventually(lambda: _published(bus, "primary") >= before + 20, 30, "publishes via node 1")

    primary_gate.close()  # node 1 goes away, connections and all
    try:
        after_cut = _published(bus, "primary")
        second = _send(bus, api_key, tmp_path / "spool2", destination, 100)
        eventually(lambda: subscriber.message_ids() >= set(first + second), 60,
                   "every message delivered while node 1 is away")
        # the publisher reconnected to node 2 by itself: later messages are published, not
        # only handed to the direct path
        third = _send(bus, api_key, tmp_path / "spool3", destination, 20)
        eventually(lambda: _published(bus, "primary") >= after_cut + 20, 30,
                   "publishes via node 2")
        eventually(lambda: subscriber.message_ids() >= set(third), 30, "later deliveries")
    finally:
        primary_gate.open()
    health = httpx.get(f"{bus.receiver_url}/health", timeout=5)
    assert health.status_code == 200


@dataclass
class KeyLog:
    """Records (biz_id, n) of each push, in arrival order."""

    pushes: list[tuple[str, int]] = field(default_factory=list)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if await answer_lifespan(scope, receive, send):
            return
        n = orjson.loads(await read_body(receive))["n"]
        self.pushes.append((request_headers(scope)["ce-bizid"], n))
        await respond(send, 204)


def _send_keyed(bus: RunningBus, api_key: str, destination: str, numbers: range) -> None:
    messages = [{"message_id": uuid7(), "destination": destination, "biz_id": f"k{k}",
                 "body": {"n": n}} for n in numbers for k in range(5)]
    post_batches(bus.receiver_url, api_key, messages, batch_size=len(messages))


def test_an_ordered_subscription_drains_the_old_cluster_before_the_new_one(
        cluster_bus: RunningBus) -> None:
    bus = cluster_bus
    bus.admin.patch("/v1/runtime", json={"active_clusters": {"rabbitmq": "primary"}}
                    ).raise_for_status()
    api_key = bus.create_app(f"ordered-dc-{uuid.uuid4().hex[:6]}")
    destination = f"dc-ordered-{uuid.uuid4().hex[:6]}"
    bus.create_destination(destination, "rabbitmq")
    log = KeyLog()
    url = bus.serve_subscriber(log)
    bus.subscribe(destination, "sub", url, ordered_by_biz_id=True, paused=True)
    bus.wait_for_config()
    _send_keyed(bus, api_key, destination, range(0, 10))  # waits in the primary cluster
    bus.admin.patch("/v1/runtime", json={"active_clusters": {"rabbitmq": "standby"}}
                    ).raise_for_status()
    bus.wait_for_config()
    _send_keyed(bus, api_key, destination, range(10, 20))  # and these in the standby one
    eventually(lambda: _published(bus, "standby") >= 50, 30, "the standby cluster's messages")

    bus.subscribe(destination, "sub", url, ordered_by_biz_id=True, paused=False)
    eventually(lambda: len(set(log.pushes)) == 100, 60, "every message pushed")
    for key in (f"k{k}" for k in range(5)):
        numbers = [n for pushed_key, n in log.pushes if pushed_key == key]
        assert numbers == list(range(20)), f"{key}: {numbers}"
