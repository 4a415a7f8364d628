"""`ReaderPool`: the Kafka reads of many subscriptions on a few librdkafka handles of one process,
without a consumer group per subscription (issue 41 part 2: a librdkafka consumer is ~650 KB and
five threads even when idle, and 500 groups of them in one dispatcher churned on tansu;
bench/RESULTS.md, "Idle subscriptions").

Each subscription reads the partitions given to it (`place`) from an offset of its own. One
handle holds a topic-partition once, so a destination's N subscriptions in this process need N
handles; subscriptions of different destinations share them, and the pool makes a handle only
when none can take a partition: as many handles as the most subscriptions of one destination
here, not one per subscription. Each handle has one thread that fetches for all its partitions
and hands each record to the subscription that placed the partition (`deliver`); a slow
subscription pauses only its own partitions (`pause`), which stay on their handle.

Offsets stay in each subscription's Kafka consumer group, read and committed through one admin
client (`GroupOffsets`), so the broker's tools and `msgbus` see each subscription's lag as
before. Who reads which partition is decided outside (the dispatcher's assignment); the pool
only reads.

Not wired into the dispatcher yet: the first piece of issue 41 part 2's reader.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from msgbus.brokers.kafka import committed_offsets

log = logging.getLogger(__name__)

# a fetch's wait with nothing to read (a record ends it at once); it bounds how soon a placement,
# a removal or a pause takes effect
POLL_S = 0.2
FETCH_BATCH = 500
ADMIN_TIMEOUT_S = 10.0

Deliver = Callable[[Message], None]


@dataclass(frozen=True)
class Lane:
    """One subscription's reading of one topic-partition."""

    reader: str  # the subscription's id
    topic: str
    partition: int


@dataclass
class _Reading:
    """A lane on its handle: where its subscription goes on from, and whether it is paused."""

    lane: Lane
    deliver: Deliver
    next_offset: int  # the next record to hand over (or a logical offset before the first)
    paused: bool = False


class _Handle:
    """One librdkafka consumer (no group) and the thread that fetches for its lanes."""

    def __init__(self, config: dict[str, object], name: str) -> None:
        self._consumer = Consumer(config)
        self._lock = threading.Lock()  # guards _lanes and _requests
        self._lanes: dict[tuple[str, int], _Reading] = {}
        # changes of the assignment and of pauses, made by the handle's thread between fetches:
        # an assign from another thread while this one fetches waited for good (librdkafka 2.16)
        self._requests: list[Callable[[Consumer], object]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def holds(self, topic: str, partition: int) -> bool:
        with self._lock:
            return (topic, partition) in self._lanes

    def add(self, lane: Lane, offset: int, deliver: Deliver) -> None:
        part = [TopicPartition(lane.topic, lane.partition, offset)]
        with self._lock:
            self._lanes[(lane.topic, lane.partition)] = _Reading(lane, deliver, offset)
            self._requests.append(lambda consumer: consumer.incremental_assign(part))

    def remove(self, lane: Lane) -> None:
        part = [TopicPartition(lane.topic, lane.partition)]
        with self._lock:
            if self._lanes.pop((lane.topic, lane.partition), None) is None:
                return
            self._requests.append(lambda consumer: consumer.incremental_unassign(part))

    def pause(self, lane: Lane, paused: bool) -> None:
        """Paused at once: what the thread fetches meanwhile is not handed over, and a resume
        reads again from the first record not handed over."""
        with self._lock:
            reading = self._lanes.get((lane.topic, lane.partition))
            if reading is None or reading.paused == paused:
                return
            if paused:
                reading.paused = True
                self._requests.append(
                    lambda consumer: consumer.pause([TopicPartition(lane.topic, lane.partition)]))
            else:
                self._requests.append(lambda consumer: self._resume(consumer, reading))

    def _resume(self, consumer: Consumer, reading: _Reading) -> None:
        """On the handle's thread, between fetches: nothing is fetched between the two."""
        part = TopicPartition(reading.lane.topic, reading.lane.partition)
        consumer.resume([part])
        consumer.seek(TopicPartition(part.topic, part.partition, reading.next_offset))
        with self._lock:
            reading.paused = False

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._consumer.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                requests, self._requests = self._requests, []
            for request in requests:
                try:
                    request(self._consumer)
                except KafkaException as exc:
                    log.warning("kafka reader %s: %s", self._thread.name, exc)
            try:
                messages = self._consumer.consume(num_messages=FETCH_BATCH, timeout=POLL_S)
            except KafkaException as exc:
                log.warning("kafka reader %s: %s", self._thread.name, exc)
                self._stop.wait(POLL_S)
                continue
            for message in messages:
                self._hand_over(message)

    def _hand_over(self, message: Message) -> None:
        if message.error() is not None:
            log.warning("kafka reader %s: %s", self._thread.name, message.error())
            return
        with self._lock:
            reading = self._lanes.get((message.topic() or "", message.partition() or 0))
            if reading is None or reading.paused:  # removed or paused while it was fetched
                return
            reading.next_offset = (message.offset() or 0) + 1
        reading.deliver(message)


class ReaderPool:
    def __init__(self, bootstrap: str, *, extra_config: dict[str, object] | None = None) -> None:
        self._config: dict[str, object] = {
            "bootstrap.servers": bootstrap,
            # no group membership: only the admin client reads and commits offsets
            "group.id": "msgbus.reader",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            **(extra_config or {}),
        }
        self._lock = threading.Lock()
        self._handles: list[_Handle] = []
        self._placed: dict[Lane, _Handle] = {}

    @property
    def handles(self) -> int:
        with self._lock:
            return len(self._handles)

    def place(self, lane: Lane, offset: int, deliver: Deliver) -> None:
        """Read `lane` from `offset` (an offset, or OFFSET_BEGINNING/OFFSET_END) on a handle
        that does not hold its topic-partition yet; `deliver` gets each record, on the
        handle's thread."""
        with self._lock:
            if lane in self._placed:
                raise ValueError(f"{lane} is read already")
            handle = next((h for h in self._handles if not h.holds(lane.topic, lane.partition)),
                          None)
            if handle is None:
                handle = _Handle(self._config, f"kafka-reader-{len(self._handles)}")
                self._handles.append(handle)
            self._placed[lane] = handle
            # under the pool's lock: a placement of the same topic-partition at the same time
            # must see this one held, not pick this handle too
            handle.add(lane, offset, deliver)

    def remove(self, lane: Lane) -> None:
        with self._lock:
            handle = self._placed.pop(lane, None)
        if handle is not None:
            handle.remove(lane)

    def pause(self, lane: Lane, paused: bool = True) -> None:
        with self._lock:
            handle = self._placed.get(lane)
        if handle is not None:
            handle.pause(lane, paused)

    def close(self) -> None:
        with self._lock:
            handles, self._handles = self._handles, []
            self._placed.clear()
        for handle in handles:
            handle.close()


class GroupOffsets:
    """Subscriptions' committed offsets, in their consumer groups, through one admin client."""

    def __init__(self, bootstrap: str) -> None:
        self._admin = AdminClient({"bootstrap.servers": bootstrap})

    def committed(self, group: str, parts: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The group's committed offset of each of `parts` that has one."""
        return committed_offsets(self._admin, group, parts, ADMIN_TIMEOUT_S)

    def commit(self, group: str, offsets: dict[tuple[str, int], int]) -> None:
        """Commit `offsets` (the next offset to read of each partition) for `group`."""
        request = ConsumerGroupTopicPartitions(
            group, [TopicPartition(t, p, offset) for (t, p), offset in offsets.items()])
        future = self._admin.alter_consumer_group_offsets([request])[group]
        result = future.result(timeout=ADMIN_TIMEOUT_S)
        failed = [tp for tp in result.topic_partitions if tp.error is not None]
        if failed:
            raise KafkaException(failed[0].error)
