"""Broker adapters against real servers: tansu (Kafka protocol) and RabbitMQ.

Every test uses its own destination (uuid), so topics, groups and queues never overlap.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import pika
import pytest
from confluent_kafka import Producer
from msgbus_devtools.testkit.waiting import NotInTime, eventually_async
from pika.adapters.blocking_connection import BlockingChannel

from msgbus.brokers._kafka_consumer import CLOCK_MARGIN_S
from msgbus.brokers._offsets import OffsetTracker
from msgbus.brokers.base import (
    Received,
    SubscriptionConsumer,
    consumer_name,
    topic_name,
)
from msgbus.brokers.kafka import KafkaPublisher, KafkaSubscriptionConsumer
from msgbus.brokers.rabbitmq import RabbitPublisher, RabbitSubscriptionConsumer
from msgbus.errors import BrokerError
from msgbus.models import BrokerKind, Destination, Envelope, Subscription

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


# ---- helpers ---------------------------------------------------------------------------------


def new_destination(broker: BrokerKind, partitions: int = 4) -> Destination:
    return Destination(code=f"t-{uuid.uuid4().hex[:10]}", broker=broker, partitions=partitions)


def new_subscription(destination: Destination, name: str) -> Subscription:
    return Subscription.model_validate(
        {"destination": destination.code, "name": name, "url": "http://127.0.0.1:9/hook"}
    )


def make_envelopes(destination: Destination, count: int, *, keys: int = 50) -> list[Envelope]:
    """Messages spread over `keys` business ids; header `seq` numbers them per business id."""
    seq: dict[str, int] = defaultdict(int)
    envelopes = []
    for i in range(count):
        biz_id = f"order-{i % keys}"
        seq[biz_id] += 1
        envelopes.append(
            Envelope(
                message_id=uuid.uuid4().hex,
                destination=destination.code,
                body=f'{{"n": {i}, "pad": "{"x" * (i % 97)}"}}'.encode(),
                biz_id=biz_id,
                source_app="test-app",
                headers={"seq": str(seq[biz_id]), "trace": f"t{i}"},
            )
        )
    return envelopes


async def take(
    consumer: SubscriptionConsumer, count: int, *, timeout_s: float = 30, ack: bool = True
) -> list[Received]:
    """Receive until `count` messages arrived (or the deadline passed: the callers' assertions
    show what is missing)."""
    got: list[Received] = []

    async def enough() -> bool:
        if len(got) >= count:
            return True
        batch = await consumer.receive(500, 1.0)  # waits up to 1 s itself
        if ack:
            for received in batch:
                consumer.ack(received)
        got.extend(batch)
        return len(got) >= count

    with contextlib.suppress(NotInTime):
        await eventually_async(enough, timeout_s, f"{count} messages", interval_s=0,
                               patient=False)
    return got


def assert_same_messages(sent: list[Envelope], received: list[Received]) -> None:
    by_id = {r.envelope.message_id: r.envelope for r in received}
    assert len(received) == len(sent) == len(by_id), "duplicates or losses"
    for envelope in sent:
        got = by_id[envelope.message_id]
        assert (got.body, got.biz_id, got.headers, got.content_type, got.source_app) == (
            envelope.body, envelope.biz_id, envelope.headers, envelope.content_type,
            envelope.source_app,
        )
        assert got.destination == envelope.destination


def assert_ordered_per_key(received: list[Received]) -> None:
    last: dict[str | None, int] = {}
    for r in received:
        seq = int(r.envelope.headers["seq"])
        assert seq > last.get(r.envelope.biz_id, 0), f"out of order for {r.envelope.biz_id}"
        last[r.envelope.biz_id] = seq


def two_subscriptions(destination: Destination) -> list[Subscription]:
    return [new_subscription(destination, "a"), new_subscription(destination, "b")]


async def publish_all(publisher: KafkaPublisher | RabbitPublisher, destination: Destination,
                      sent: list[Envelope]) -> None:
    """Every message confirmed, one outcome per message in the order sent."""
    outcomes = await publisher.publish(destination, sent)
    assert [o.message_id for o in outcomes] == [e.message_id for e in sent]
    assert all(o.ok for o in outcomes), [o.error for o in outcomes if not o.ok][:3]


async def published(publisher: KafkaPublisher | RabbitPublisher, destination: Destination,
                    count: int, *, keys: int = 50) -> list[Envelope]:
    """`count` new messages (see `make_envelopes`), every one confirmed."""
    envelopes = make_envelopes(destination, count, keys=keys)
    assert all(o.ok for o in await publisher.publish(destination, envelopes))
    return envelopes


async def assert_each_gets_all_in_order(
    consumers: list[KafkaSubscriptionConsumer] | list[RabbitSubscriptionConsumer],
    sent: list[Envelope],
) -> None:
    """Every consumer receives (and acks) every message intact, in order per business id, and
    nothing more; the consumers are closed after."""
    try:
        await asyncio.gather(*(c.start() for c in consumers))
        results = await asyncio.gather(*(take(c, len(sent)) for c in consumers))
        for consumer, received in zip(consumers, results, strict=True):
            assert_same_messages(sent, received)
            assert_ordered_per_key(received)
            assert await consumer.receive(10, 0.3) == []
    finally:
        await closing(*consumers)


async def closing(*items: KafkaSubscriptionConsumer | RabbitSubscriptionConsumer) -> None:
    await asyncio.gather(*(item.close() for item in items))


# ---- Kafka ---------------------------------------------------------------------------------------


def test_offset_window_commits_only_up_to_lowest_in_flight() -> None:
    tracker = OffsetTracker()
    tracker.assign([("t", 0)])
    tokens = [t for t in (tracker.add("t", 0, o) for o in range(1000, 1011)) if t is not None]
    assert len(tokens) == tracker.in_flight == 11
    for token in tokens[2:]:  # 1002..1010 done, 1000 and 1001 still in flight
        tracker.ack(token)
    assert tracker.to_commit() == {("t", 0): 1000}
    tracker.ack(tokens[0])
    assert tracker.to_commit() == {("t", 0): 1001}  # 1001 holds the commit
    assert tracker.to_commit() == {}  # nothing moved since
    tracker.ack(tokens[1])
    assert tracker.to_commit() == {("t", 0): 1011} and tracker.in_flight == 0
    assert tracker.add("t", 0, 1005) is None  # a re-fetch of a tracked offset is dropped
    tracker.revoke([("t", 0)])
    tracker.assign([("t", 0)])
    assert tracker.ack(tokens[0]) is False  # a token of the old window


def test_offsets_never_handed_out_are_read_again_not_waited_for() -> None:
    tracker = OffsetTracker()
    tracker.assign([("t", 0)])
    tokens = [t for t in (tracker.add("t", 0, o) for o in range(10)) if t is not None]
    tracker.ack(tokens[0])
    tracker.unfetch_from(("t", 0), 4)  # 4..9 were still buffered
    assert tracker.in_flight_of([("t", 0)]) == 3  # 1, 2 and 3 were handed out
    for token in tokens[1:4]:
        tracker.ack(token)
    assert tracker.in_flight == 0 and tracker.to_commit() == {("t", 0): 4}
    assert tracker.add("t", 0, 4) is not None  # fetched again after a seek



@pytest.fixture
async def kafka_publisher(kafka_bootstrap: str) -> AsyncIterator[KafkaPublisher]:
    publisher = KafkaPublisher(kafka_bootstrap)
    await publisher.start()
    yield publisher
    await publisher.close()


async def kafka_topic(publisher: KafkaPublisher, subscription: str,
                      partitions: int) -> tuple[Destination, Subscription]:
    """A new destination with one subscription, its topic created."""
    dest = new_destination(BrokerKind.KAFKA, partitions=partitions)
    sub = new_subscription(dest, subscription)
    await publisher.ensure_topology(dest, [sub])
    return dest, sub


def kafka_consumer(
    bootstrap: str,
    subscription: Subscription,
    max_buffered: int = 1000,
    extra_config: dict[str, object] | None = None,
    clock_margin_s: float = CLOCK_MARGIN_S,
) -> KafkaSubscriptionConsumer:
    return KafkaSubscriptionConsumer(
        subscription, bootstrap=bootstrap, max_buffered=max_buffered, extra_config=extra_config,
        clock_margin_s=clock_margin_s,
    )


async def test_kafka_fanout_to_two_groups_intact_and_ordered_per_key(
    kafka_bootstrap: str, kafka_publisher: KafkaPublisher
) -> None:
    dest = new_destination(BrokerKind.KAFKA, partitions=4)
    subs = two_subscriptions(dest)
    await kafka_publisher.ensure_topology(dest, subs)
    await kafka_publisher.ensure_topology(dest, subs)  # idempotent

    # A record that is not an envelope is skipped (and counts as done), never fatal.
    raw = Producer({"bootstrap.servers": kafka_bootstrap})
    raw.produce(topic_name(dest.code), key=b"order-1", value=b"not an envelope")
    assert raw.flush(10) == 0

    sent = make_envelopes(dest, 2000)
    await publish_all(kafka_publisher, dest, sent)
    await assert_each_gets_all_in_order([kafka_consumer(kafka_bootstrap, s) for s in subs], sent)


async def test_kafka_commit_window_restarts_at_lowest_unacked(
    kafka_bootstrap: str, kafka_publisher: KafkaPublisher
) -> None:
    dest, sub = await kafka_topic(kafka_publisher, "window", partitions=1)
    sent = await published(kafka_publisher, dest, 20)
    ids = [e.message_id for e in sent]

    first = kafka_consumer(kafka_bootstrap, sub)
    await first.start()
    try:
        received = await take(first, 20, ack=False)
        assert [r.envelope.message_id for r in received] == ids
        for r in received:  # all done except the message at offset 5
            if r.envelope.message_id != ids[5]:
                first.ack(r)
    finally:
        await first.close()

    second = kafka_consumer(kafka_bootstrap, sub)
    await second.start()
    try:
        again = await take(second, 15)
        assert [r.envelope.message_id for r in again] == ids[5:]
        assert all(r.envelope.redelivered for r in again), "handed out again, not flagged"
        assert await second.receive(10, 0.5) == []
    finally:
        await second.close()


async def test_kafka_records_appended_before_the_assignment_come_flagged_redelivered(
    kafka_bootstrap: str, kafka_publisher: KafkaPublisher
) -> None:
    """Only what the log held when the partition was assigned may have gone to a previous
    owner: the dispatcher looks up those, and neither the records appended later nor the
    backlog of a group that never committed (a new subscription)."""
    dest, sub = await kafka_topic(kafka_publisher, "flags", partitions=1)

    first_backlog = await published(kafka_publisher, dest, 5)
    first = kafka_consumer(kafka_bootstrap, sub)
    await first.start()
    try:
        received = await take(first, 5)
        assert not any(r.envelope.redelivered for r in received), "a new group's backlog"
    finally:
        await first.close()  # commits
    assert [r.envelope.message_id for r in received] == [e.message_id for e in first_backlog]

    waiting = await published(kafka_publisher, dest, 5)  # while nobody consumes
    second = kafka_consumer(kafka_bootstrap, sub, clock_margin_s=0.2)
    await second.start()
    try:
        received = await take(second, 5)
        assert [r.envelope.message_id for r in received] == [e.message_id for e in waiting]
        assert all(r.envelope.redelivered for r in received)
        # what is appended from now on cannot have been read before the assignment: the
        # clock past it plus the margin, by more than a record timestamp's 1 ms resolution
        await eventually_async(
            lambda: time.time() > max(second._assigned_at.values()) + 0.2 + 0.002, 15,
            "the wall clock past the assignment plus the clock margin", interval_s=0.01)
        after = await published(kafka_publisher, dest, 5)
        fresh = await take(second, 5)
        assert [r.envelope.message_id for r in fresh] == [e.message_id for e in after]
        assert not any(r.envelope.redelivered for r in fresh)
    finally:
        await second.close()


async def test_a_rebalance_waits_for_what_was_handed_out_so_nobody_gets_it_again(
    kafka_bootstrap: str, kafka_publisher: KafkaPublisher
) -> None:
    """A member gives up its partitions only once what it handed out is done (up to a grace):
    a message being pushed when another dispatcher joins is not handed to the next owner too,
    which would push it a second time (beside the compensator's retry, had it failed)."""
    dest, sub = await kafka_topic(kafka_publisher, "handover", partitions=2)
    sent = await published(kafka_publisher, dest, 40, keys=8)
    first, second = kafka_consumer(kafka_bootstrap, sub), kafka_consumer(kafka_bootstrap, sub)
    await first.start()
    try:
        held: list[Received] = []

        async def ten_held() -> bool:
            held.extend(await first.receive(10 - len(held), 1.0))  # waits up to 1 s itself
            return len(held) >= 10

        await eventually_async(ten_held, 30, "10 messages held by the first consumer",
                               interval_s=0)
        await eventually_async(lambda: first.buffered > 0, 15)
        await second.start()
        # its revoke began: the buffer went back
        await eventually_async(lambda: first.buffered == 0, 15)
        for received in held:
            first.ack(received)
        rest: list[Received] = []

        async def received_all() -> bool:
            for consumer in (first, second):
                for received in await consumer.receive(100, 0.2):
                    consumer.ack(received)
                    rest.append(received)
            return len(held) + len(rest) >= len(sent)

        await eventually_async(received_all, timeout_s=30)
        assert_same_messages(sent, held + rest)  # none twice: the held ones were committed
        assert second.assignments >= 1
    finally:
        await closing(first, second)


async def test_kafka_slow_subscriber_pauses_instead_of_rebalancing(
    kafka_bootstrap: str, kafka_publisher: KafkaPublisher
) -> None:
    dest, sub = await kafka_topic(kafka_publisher, "slow", partitions=2)
    sent = await published(kafka_publisher, dest, 30, keys=7)

    # max.poll.interval.ms at its minimum (= session timeout): a poll gap that long would
    # make librdkafka leave the group and rejoin, i.e. a second assignment.
    consumer = kafka_consumer(
        kafka_bootstrap, sub, max_buffered=5, extra_config={"max.poll.interval.ms": 6000}
    )
    await consumer.start()
    try:
        held = await take(consumer, 5, ack=False)
        assert len(held) == 5
        await eventually_async(lambda: consumer.paused, 15)
        hold_until = time.monotonic() + 7.0  # longer than session.timeout.ms=6000
        while time.monotonic() < hold_until:
            assert await consumer.receive(10, 0.5) == []  # nothing beyond max_buffered
        assert consumer.in_flight == 5
        for r in held:
            consumer.ack(r)
        rest = await take(consumer, len(sent) - 5)
        assert_same_messages(sent, held + rest)
        assert await consumer.receive(10, 0.5) == []
        assert consumer.assignments == 1, "the group rebalanced"
        assert consumer.pauses >= 1
    finally:
        await consumer.close()


async def test_kafka_publisher_start_fails_on_unreachable_broker_and_bad_config() -> None:
    unreachable = KafkaPublisher("127.0.0.1:1", connect_timeout_s=1)
    with pytest.raises(BrokerError):
        await unreachable.start()
    bad = KafkaPublisher("127.0.0.1:1", extra_config={"no.such.property": 1})
    with pytest.raises(BrokerError):
        await bad.start()


# ---- RabbitMQ ------------------------------------------------------------------------------------


@pytest.fixture
async def rabbit_publisher(rabbitmq_url: str) -> AsyncIterator[RabbitPublisher]:
    publisher = RabbitPublisher(rabbitmq_url, confirm_timeout_s=10)
    await publisher.start()
    yield publisher
    await publisher.close()


@dataclass
class Amqp:
    """A plain pika channel to inspect queues; deletes what a test registered at the end."""

    channel: BlockingChannel
    exchanges: list[str] = field(default_factory=list)
    queues: list[str] = field(default_factory=list)

    def track(self, destination: Destination, *subscriptions: Subscription) -> list[str]:
        self.exchanges.append(topic_name(destination.code))
        queues = [consumer_name(destination.code, s.name) for s in subscriptions]
        self.queues.extend(queues)
        return queues

    def depth(self, queue: str) -> int:
        return int(self.channel.queue_declare(queue, passive=True).method.message_count)


async def rabbit_queue(publisher: RabbitPublisher, amqp: Amqp,
                       subscription: str) -> tuple[Destination, Subscription, str]:
    """A new destination with one subscription, its exchange and queue declared (and tracked)."""
    dest = new_destination(BrokerKind.RABBITMQ)
    sub = new_subscription(dest, subscription)
    [queue] = amqp.track(dest, sub)
    await publisher.ensure_topology(dest, [sub])
    return dest, sub, queue


@pytest.fixture
def amqp(rabbitmq_url: str) -> Iterator[Amqp]:
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    inspector = Amqp(connection.channel())
    yield inspector
    for queue in inspector.queues:
        inspector.channel.queue_delete(queue)
    for exchange in inspector.exchanges:
        inspector.channel.exchange_delete(exchange)
    connection.close()


async def test_rabbit_fanout_to_two_queues_intact_and_ordered(
    rabbitmq_url: str, rabbit_publisher: RabbitPublisher, amqp: Amqp
) -> None:
    dest = new_destination(BrokerKind.RABBITMQ)
    subs = two_subscriptions(dest)
    queues = amqp.track(dest, *subs)
    await rabbit_publisher.ensure_topology(dest, subs)
    await rabbit_publisher.ensure_topology(dest, subs)  # idempotent

    sent = make_envelopes(dest, 2000)
    await publish_all(rabbit_publisher, dest, sent)
    await assert_each_gets_all_in_order(
        [RabbitSubscriptionConsumer(s, url=rabbitmq_url, max_buffered=500) for s in subs], sent)
    await eventually_async(lambda: all(amqp.depth(q) == 0 for q in queues), 15)  # all acked


async def test_rabbit_unroutable_publish_is_an_error_outcome(
    rabbit_publisher: RabbitPublisher, amqp: Amqp
) -> None:
    lonely = new_destination(BrokerKind.RABBITMQ)  # exchange without any bound queue
    never_declared = new_destination(BrokerKind.RABBITMQ)  # publish declares the exchange
    routed = new_destination(BrokerKind.RABBITMQ)
    sub = new_subscription(routed, "ok")
    for dest in (lonely, never_declared):
        amqp.track(dest)
    amqp.track(routed, sub)
    await rabbit_publisher.ensure_topology(lonely, [])
    await rabbit_publisher.ensure_topology(routed, [sub])

    for dest in (lonely, never_declared):
        outcomes = await rabbit_publisher.publish(dest, make_envelopes(dest, 3))
        assert len(outcomes) == 3
        assert all(o.error is not None and "unroutable" in o.error for o in outcomes), outcomes

    # The channel survived: routable messages are still confirmed.
    outcomes = await rabbit_publisher.publish(routed, make_envelopes(routed, 3))
    assert all(o.ok for o in outcomes), outcomes


async def test_rabbit_batch_persists_in_durable_queue(
    rabbit_publisher: RabbitPublisher, amqp: Amqp
) -> None:
    dest, _sub, queue = await rabbit_queue(rabbit_publisher, amqp, "store")

    sent = await published(rabbit_publisher, dest, 2000)
    assert amqp.depth(queue) == 2000  # confirmed means enqueued: exact at once

    method, properties, _body = amqp.channel.basic_get(queue, auto_ack=False)
    assert method is not None
    assert properties.delivery_mode == 2
    assert properties.message_id == sent[0].message_id
    assert properties.content_type == sent[0].content_type
    assert method.routing_key == sent[0].biz_id
    assert method.exchange == topic_name(dest.code)
    amqp.channel.basic_nack(method.delivery_tag, requeue=True)


async def test_rabbit_consumer_reconnects_and_gets_unacked_redelivered(
    rabbitmq_url: str, rabbit_publisher: RabbitPublisher, amqp: Amqp
) -> None:
    dest, sub, queue = await rabbit_queue(rabbit_publisher, amqp, "flaky")
    sent = await published(rabbit_publisher, dest, 10)

    consumer = RabbitSubscriptionConsumer(sub, url=rabbitmq_url, max_buffered=100)
    await consumer.start()
    try:
        first = await take(consumer, 10, ack=False)
        assert len(first) == 10
        assert not any(r.envelope.redelivered for r in first)
        await drop_connection(consumer)
        await eventually_async(lambda: consumer.connections == 2, 15)
        for r in first:
            consumer.ack(r)  # tokens of the dead connection: ignored, not an error
        again = await take(consumer, 10)
        assert_same_messages(sent, again)
        assert all(r.envelope.redelivered for r in again), "handed out again, not flagged"
    finally:
        await consumer.close()
    await eventually_async(lambda: amqp.depth(queue) == 0, 15)


async def test_rabbit_consumers_of_a_process_share_one_connection_and_a_deleted_queue_returns(
    rabbitmq_url: str, rabbit_publisher: RabbitPublisher, amqp: Amqp
) -> None:
    """Forty subscriptions consumed in one process: one connection and one thread, a channel
    each, and each gets every message. A queue deleted under one of them is declared again and
    consumed within seconds, while the others go on."""
    dest = new_destination(BrokerKind.RABBITMQ)
    subs = [new_subscription(dest, f"s{n}") for n in range(40)]
    queues = amqp.track(dest, *subs)
    await rabbit_publisher.ensure_topology(dest, subs)
    consumers = [RabbitSubscriptionConsumer(s, url=rabbitmq_url, max_buffered=100)
                 for s in subs]
    try:
        await asyncio.gather(*(c.start() for c in consumers))
        [hub] = {c._hub for c in consumers}
        assert hub is not None
        await eventually_async(lambda: all(c.connections == 1 for c in consumers), 15,
                               "every consumer on its channel")
        names = [t.name for t in threading.enumerate()]
        assert hub._thread is not None and hub._thread.name in names
        assert not [n for n in names if any(q in n for q in queues)], names
        sent = await published(rabbit_publisher, dest, 20)
        for consumer in consumers:
            assert_same_messages(sent, await take(consumer, 20))

        amqp.channel.queue_delete(queues[0])
        await eventually_async(lambda: consumers[0].connections == 2, 15,
                               "the deleted queue declared and consumed again")
        more = await published(rabbit_publisher, dest, 5)
        for consumer in consumers:
            assert_same_messages(more, await take(consumer, 5))
    finally:
        await closing(*consumers)
    await eventually_async(lambda: all(amqp.depth(q) == 0 for q in queues), 15, "all acked")
    assert not set(consumers) & hub._members
    # its thread ends with its last consumer (another test's bus in this process may hold one)
    await eventually_async(lambda: hub._thread is None or hub.size > 0, 15,
                           "the hub's thread ended")


async def test_rabbit_publisher_reconnects_after_connection_loss(
    rabbit_publisher: RabbitPublisher, amqp: Amqp
) -> None:
    dest, _sub, queue = await rabbit_queue(rabbit_publisher, amqp, "after-loss")
    await published(rabbit_publisher, dest, 5)

    await drop_connection(rabbit_publisher)
    outcomes = await rabbit_publisher.publish(dest, make_envelopes(dest, 5))
    assert all(o.ok for o in outcomes), outcomes
    assert amqp.depth(queue) == 10


async def test_rabbit_publisher_start_fails_on_unreachable_broker() -> None:
    publisher = RabbitPublisher("amqp://guest:guest@127.0.0.1:1/%2F", connect_timeout_s=2)
    with pytest.raises(BrokerError):
        await publisher.start()


async def drop_connection(adapter: RabbitPublisher | RabbitSubscriptionConsumer) -> None:
    """Close the adapter's AMQP connection from its own thread, as a broker restart would."""
    if isinstance(adapter, RabbitPublisher):
        io = adapter._io
        assert io is not None and io._connection is not None
        connection = io._connection
        io._ioloop.add_callback_threadsafe(connection.close)
        await eventually_async(lambda: connection.is_closed, 15)
        return
    hub = adapter._hub  # the process's shared connection to the cluster
    assert hub is not None
    blocking = hub._connection
    assert blocking is not None
    blocking.add_callback_threadsafe(blocking.close)
    await eventually_async(lambda: blocking.is_closed, 15)

