"""Deleting subscriptions and destinations under load, and skipping a backlog, on Kafka and
RabbitMQ: pushes stop, the broker's consumer groups, queues, topics and exchanges go, the
records stay, and every action is in the audit log."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pika
import pytest
from click.testing import CliRunner
from confluent_kafka.admin import AdminClient
from msgbus_devtools.testkit.bus import RunningBus
from msgbus_devtools.testkit.sending import post_batches
from msgbus_devtools.testkit.subscriber import RecordingSubscriber
from msgbus_devtools.testkit.waiting import eventually
from pika.exceptions import ChannelClosedByBroker

from msgbus.brokers.base import consumer_name, topic_name
from msgbus.ids import uuid7
from msgbus.models import DeliveryStatus
from msgbus_cli.main import main as cli


def _new_destination(bus: RunningBus, prefix: str, broker: str, unique: str) -> str:
    """A destination of the test's own on `broker`: `prefix-broker-unique`."""
    destination = f"{prefix}-{broker}-{unique}"
    bus.create_destination(destination, broker)
    return destination


def _send(bus: RunningBus, api_key: str, destination: str, count: int) -> list[str]:
    """`count` messages in batches of 50; every one accepted."""
    ids = [uuid7() for _ in range(count)]
    post_batches(bus.receiver_url, api_key, [
        {"message_id": m, "destination": destination, "body": {"n": 1}} for m in ids])
    return ids


def _kafka_has(bus: RunningBus, *, group: str | None = None, topic: str | None = None) -> bool:
    admin = AdminClient({"bootstrap.servers": bus.connections.kafka_bootstrap})
    if group is not None:
        return group in {g.group_id for g in admin.list_consumer_groups().result(10).valid}
    return topic in admin.list_topics(timeout=10).topics


def _rabbit_has(bus: RunningBus, *, queue: str | None = None, exchange: str | None = None
                ) -> bool:
    connection = pika.BlockingConnection(pika.URLParameters(bus.connections.rabbitmq_url))
    try:
        channel = connection.channel()
        if queue is not None:
            channel.queue_declare(queue, passive=True)
        else:
            channel.exchange_declare(exchange, passive=True)
        return True
    except ChannelClosedByBroker as exc:
        assert exc.reply_code == 404, exc
        return False
    finally:
        if connection.is_open:
            connection.close()


def _has_consumer(bus: RunningBus, broker: str, destination: str, name: str) -> bool:
    resource = consumer_name(destination, name)
    return (_kafka_has(bus, group=resource) if broker == "kafka"
            else _rabbit_has(bus, queue=resource))


def _has_topic(bus: RunningBus, broker: str, destination: str) -> bool:
    resource = topic_name(destination)
    return (_kafka_has(bus, topic=resource) if broker == "kafka"
            else _rabbit_has(bus, exchange=resource))


def _deletions_done(bus: RunningBus) -> bool:
    return bus.query(bus.store.db["deletions"].count_documents({})) == 0


def _audited(bus: RunningBus, target: str) -> list[str]:
    return [e["action"] for e in bus.admin.get("/v1/audit", params={"target": target}).json()]


@pytest.mark.parametrize("broker", ["kafka", "rabbitmq"])
def test_deleting_a_subscription_under_load_stops_it_and_removes_its_consumer(
        bus: RunningBus, api_key: str, unique: str, broker: str) -> None:
    destination = _new_destination(bus, "del-sub", broker, unique)
    kept = bus.subscribe_recorder(destination, "kept")
    gone = bus.subscribe_recorder(destination, "gone")
    first = _send(bus, api_key, destination, 200)
    eventually(lambda: gone.message_ids() >= set(first), 60, "the first messages delivered")
    eventually(lambda: _has_consumer(bus, broker, destination, "gone"), 30,
               "its consumer group or queue in the broker", interval_s=0.5)

    sent: list[str] = []
    load = threading.Thread(target=lambda: sent.extend(_send(bus, api_key, destination, 500)))
    load.start()
    response = bus.admin.delete(f"/v1/destinations/{destination}/subscriptions/gone")
    assert response.status_code == 200, response.text
    again = bus.admin.put(f"/v1/destinations/{destination}/subscriptions/gone",
                          json={"url": "http://127.0.0.1:9/hook"})
    assert again.status_code == 409 and "still being removed" in again.json()["message"]
    load.join(60)

    eventually(lambda: _deletions_done(bus), 60, "the deletion carried out")
    assert not _has_consumer(bus, broker, destination, "gone")
    pushed_to_gone = len(gone.pushes)
    later = _send(bus, api_key, destination, 50)
    eventually(lambda: kept.message_ids() >= set(first + sent + later), 60,
               "the other subscription getting everything")
    assert len(gone.pushes) == pushed_to_gone, "pushed after its deletion was carried out"
    assert f"{destination}/gone" not in httpx.get(f"{bus.dispatcher_url}/health").json()[
        "subscriptions"]
    # its records stay (the dispatcher writes them from its local trace buffer: soon, not at once)
    def gone_delivered_on_record() -> bool:
        states = bus.query(bus.store.traces.deliveries_of(first[0]))
        return (f"{destination}/gone", DeliveryStatus.DELIVERED.value) in {
            (s["subscription"], s["status"]) for s in states}

    eventually(gone_delivered_on_record, 30, "the deleted subscription's delivery on record")
    assert _audited(bus, f"{destination}/gone")[:1] == ["subscription.delete"]
    # and the name can be used again
    bus.subscribe(destination, "gone", bus.serve_subscriber(RecordingSubscriber()))


@pytest.mark.parametrize("broker", ["kafka", "rabbitmq"])
def test_deleting_a_destination_refuses_producers_and_removes_its_topic(
        bus: RunningBus, api_key: str, unique: str, broker: str) -> None:
    destination = _new_destination(bus, "del-dest", broker, unique)
    subscriber = bus.subscribe_recorder(destination, "only")
    ids = _send(bus, api_key, destination, 100)
    eventually(lambda: subscriber.message_ids() >= set(ids), 60, "the messages delivered")
    eventually(lambda: _has_topic(bus, broker, destination), 30, "its topic or exchange",
               interval_s=0.5)

    response = bus.admin.delete(f"/v1/destinations/{destination}")
    assert response.status_code == 200, response.text
    assert response.json()["subscriptions"] == ["only"]

    def refused() -> bool:
        answer = httpx.post(f"{bus.receiver_url}/v1/destinations/{destination}/messages",
                            json={"n": 1}, headers={"authorization": f"Bearer {api_key}"},
                            timeout=10)
        return answer.status_code == 404
    eventually(refused, 30, "producers refused with 404")
    eventually(lambda: _deletions_done(bus), 60, "the deletions carried out")
    assert not _has_topic(bus, broker, destination)
    assert not _has_consumer(bus, broker, destination, "only")
    assert bus.admin.get(f"/v1/destinations/{destination}/subscriptions/only/pushers"
                         ).status_code == 404
    assert bus.query(bus.store.traces.deliveries_of(ids[0])), "its records stay"
    assert _audited(bus, destination)[:1] == ["destination.delete"]


@pytest.mark.parametrize("broker", ["kafka", "rabbitmq"])
def test_skipping_a_backlog_records_it_skipped_and_pushes_what_comes_next(
        bus: RunningBus, api_key: str, unique: str, broker: str) -> None:
    destination = _new_destination(bus, "skip", broker, unique)
    subscriber = bus.subscribe_recorder(destination, "behind", paused=True)
    if broker == "rabbitmq":  # the receiver declares the paused subscription's queue
        eventually(lambda: _rabbit_has(bus, queue=consumer_name(destination, "behind")), 30,
                   "the subscription's queue", interval_s=0.2)
    backlog = _send(bus, api_key, destination, 200)

    response = bus.admin.post(f"/v1/destinations/{destination}/subscriptions/behind/skip",
                              json={"reason": "stale prices", "requested_by": "ops-anna"})
    assert response.status_code == 200, response.text
    bus.admin.post(f"/v1/destinations/{destination}/subscriptions/behind/resume"
                   ).raise_for_status()
    bus.wait_for_workers([f"{destination}/behind"])
    fresh = _send(bus, api_key, destination, 20)
    eventually(lambda: subscriber.message_ids() >= set(fresh), 60, "the new messages pushed")
    sub_id = f"{destination}/behind"

    def skipped() -> dict[str, Any]:
        docs = bus.query(bus.store.db.deliveries.find(
            {"subscription": sub_id, "status": DeliveryStatus.SKIPPED.value},
            {"message_id": 1, "last_error": 1}).to_list(None))
        return {d["message_id"]: d["last_error"] for d in docs}

    eventually(lambda: set(skipped()) >= set(backlog), 60, "the backlog recorded as skipped")
    assert not subscriber.message_ids() & set(backlog), "a skipped message was pushed"
    reasons = set(skipped().values())
    assert all(r.startswith("skipped by an operator: stale prices (by ops-anna") for r in reasons
               ), reasons
    assert _audited(bus, sub_id)[:2] == ["subscription.resume", "subscription.skip"]


def test_the_cli_skips_and_deletes(bus: RunningBus, unique: str) -> None:
    destination = f"cli-del-{unique}"
    bus.create_destination(destination, "rabbitmq")
    bus.subscribe(destination, "s", bus.serve_subscriber(RecordingSubscriber()))
    admin = ["--admin", bus.admin_url, "--token", bus.admin_token]
    runner = CliRunner()

    skip = runner.invoke(cli, ["subscription", "skip", *admin, destination, "s", "--reason",
                               "old news", "--by", "ops-cli", "--yes"])
    assert skip.exit_code == 0, skip.output
    assert "undelivered states now skipped" in skip.output
    asked = runner.invoke(cli, ["subscription", "delete", *admin, destination, "s"], input="n\n")
    assert asked.exit_code == 1 and "Aborted" in asked.output
    assert bus.admin.get(f"/v1/destinations/{destination}/subscriptions/s/pushers"
                         ).status_code == 200
    deleted = runner.invoke(cli, ["subscription", "delete", *admin, destination, "s", "--yes"])
    assert deleted.exit_code == 0 and f"deleted {destination}/s" in deleted.output
    gone = runner.invoke(cli, ["destination", "delete", *admin, destination, "--yes"])
    assert gone.exit_code == 0 and "0 subscription(s)" in gone.output
    missing = runner.invoke(cli, ["destination", "delete", *admin, destination, "--yes"])
    assert missing.exit_code == 1 and "404" in missing.output
