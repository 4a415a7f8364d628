"""The Kafka reader pool (msgbus/brokers/_kafka_reader.py) on the test kit's Kafka-protocol broker:
twelve subscriptions of two topics read on six librdkafka handles, not twelve, each from its own
offset; a paused partition holds back only its subscription; offsets committed to each
subscription's consumer group are where a new pool starts again."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable

from confluent_kafka import OFFSET_BEGINNING, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from msgbus_devtools.testkit.waiting import eventually

from msgbus.brokers._kafka_reader import GroupOffsets, Lane, ReaderPool

PARTITIONS = 2
PER_TOPIC = 6  # subscriptions of each topic


class Records:
    """What each subscription received: (topic, partition, offset, value), by subscription."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.by_reader: dict[str, list[tuple[str, int, int, bytes]]] = defaultdict(list)

    def deliver_to(self, reader: str) -> Callable[[Message], None]:
        def deliver(message: Message) -> None:
            with self._lock:
                self.by_reader[reader].append((message.topic() or "", message.partition() or 0,
                                               message.offset() or 0, message.value() or b""))
        return deliver

    def count(self, reader: str) -> int:
        with self._lock:
            return len(self.by_reader[reader])

    def values(self, reader: str) -> list[bytes]:
        with self._lock:
            return sorted(r[3] for r in self.by_reader[reader])


def _produce(bootstrap: str, topic: str, partition: int, values: list[str]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for value in values:
        producer.produce(topic, value.encode(), partition=partition)
    assert producer.flush(30) == 0


def test_subscriptions_share_a_few_handles_and_keep_their_own_offsets(
        kafka_bootstrap: str, unique: str) -> None:
    topics = [f"msgbus.reader-{unique}-{n}" for n in range(2)]
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    created = admin.create_topics(
        [NewTopic(t, num_partitions=PARTITIONS, replication_factor=1) for t in topics])
    for future in created.values():
        future.result(timeout=30)
    for topic in topics:
        for partition in range(PARTITIONS):
            _produce(kafka_bootstrap, topic, partition,
                     [f"{topic}/{partition}/{n}" for n in range(10)])
    readers = {f"{topic}~s{n}": topic for topic in topics for n in range(PER_TOPIC)}
    records = Records()
    pool = ReaderPool(kafka_bootstrap)
    try:
        for reader, topic in readers.items():
            for partition in range(PARTITIONS):
                pool.place(Lane(reader, topic, partition), OFFSET_BEGINNING,
                           records.deliver_to(reader))
        eventually(lambda: all(records.count(r) == 20 for r in readers), 60,
                   "every subscription reading its topic's 20 records",
                   progress=lambda: str(sorted(records.count(r) for r in readers)))
        assert pool.handles == PER_TOPIC
        for reader, topic in readers.items():
            assert records.values(reader) == sorted(
                f"{topic}/{p}/{n}".encode() for p in range(PARTITIONS) for n in range(10))

        # a paused partition holds back its subscription only
        slow, topic = next(iter(readers.items()))
        pool.pause(Lane(slow, topic, 0))
        _produce(kafka_bootstrap, topic, 0, [f"{topic}/0/{n}" for n in range(10, 15)])
        others = [r for r, t in readers.items() if t == topic and r != slow]
        eventually(lambda: all(records.count(r) == 25 for r in others), 30,
                   "the others reading the 5 new records")
        assert records.count(slow) == 20
        pool.pause(Lane(slow, topic, 0), paused=False)
        eventually(lambda: records.count(slow) == 25, 30, "the paused one, once resumed")
    finally:
        pool.close()

    # offsets committed to each subscription's group are where the next pool starts
    offsets = GroupOffsets(kafka_bootstrap)
    parts = [(t, p) for t in topics for p in range(PARTITIONS)]
    for reader, topic in readers.items():
        done = {(t, p): max(o for t2, p2, o, _ in records.by_reader[reader]
                            if (t2, p2) == (t, p)) + 1
                for t, p in parts if t == topic}
        offsets.commit(f"msgbus.{reader}", done)
        assert offsets.committed(f"msgbus.{reader}", list(done)) == done
    for topic in topics:
        _produce(kafka_bootstrap, topic, 1, [f"{topic}/1/{n}" for n in range(10, 13)])
    again = Records()
    pool = ReaderPool(kafka_bootstrap)
    try:
        for reader, topic in readers.items():
            committed = offsets.committed(f"msgbus.{reader}", [(topic, p)
                                                                for p in range(PARTITIONS)])
            for partition in range(PARTITIONS):
                pool.place(Lane(reader, topic, partition), committed[(topic, partition)],
                           again.deliver_to(reader))
        eventually(lambda: all(again.count(r) == 3 for r in readers), 60,
                   "every subscription reading only the 3 records after its commit",
                   progress=lambda: str(sorted(again.count(r) for r in readers)))
    finally:
        pool.close()
