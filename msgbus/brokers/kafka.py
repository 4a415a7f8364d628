"""Kafka adapter (confluent-kafka): a destination is a topic, a subscription a consumer group.

Publisher: one idempotent producer (acks=all by default); records are keyed by `biz_id` (else
`message_id`) so all messages of one business key stay in one partition, in order. A poll
thread serves delivery reports and resolves each publish batch's asyncio future through
`call_soon_threadsafe`. A publish waits at most `publish_timeout_ms` for the broker (a hung
broker: its messages then go the direct path). A producer the broker fenced, or that librdkafka
declared fatally failed, is replaced by a new one (a new producer id) at the next publish.
New topics get the configured replication factor and min.insync.replicas.

Consumer: `KafkaSubscriptionConsumer` (in `_kafka_consumer`, re-exported here).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import (
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

from msgbus import codec
from msgbus.brokers._batch import PublishBatch
from msgbus.brokers._kafka_consumer import KafkaSubscriptionConsumer
from msgbus.brokers.base import Publisher, PublishOutcome, topic_name
from msgbus.errors import BrokerError
from msgbus.models import DEFAULT_CLUSTER, BrokerKind, Destination, Envelope, Subscription

__all__ = ["KafkaPublisher", "KafkaSubscriptionConsumer"]

log = logging.getLogger(__name__)

_PRODUCE_CHUNK = 500  # yield to the event loop after this many produce() calls
_PROBE_TIMEOUT_S = 2.0
_PROBE_EVERY_S = 3.0
_CLOSE_FLUSH_S = 10.0
_DISCARD_FLUSH_S = 1.0  # serving the failure reports of a replaced producer's purged messages
REPLACE_MIN_INTERVAL_S = 5.0  # a producer is replaced at most this often
# the broker refuses this producer id for good: only a new producer (a new id) publishes again
_FENCED = frozenset({KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH,
                     KafkaError._FENCED})


def _message_key(envelope: Envelope) -> bytes:
    return (envelope.biz_id if envelope.biz_id is not None else envelope.message_id).encode()


def unusable_reason(err: KafkaError) -> str | None:
    """Why a producer that got `err` can publish no more; None if it still can.

    Found with tansu 0.6 (tests/integration/test_broker_hangs.py): once messages time out (a
    hung broker), librdkafka bumps the idempotent producer's epoch on its own, which Kafka
    accepts and tansu answers with PRODUCER_FENCED, to that produce request and every later
    one. Nothing in librdkafka recovers from that (the error is neither fatal nor retriable)."""
    if err.fatal():
        return f"fatal error: {err.str()}"
    if err.code() in _FENCED:
        return f"fenced: {err.str()}"
    return None


class _PolledProducer:
    """One confluent Producer and the thread that serves its delivery reports."""

    def __init__(self, config: dict[str, Any], on_error: Callable[[KafkaError], None]) -> None:
        self.unusable: str | None = None  # why it can publish no more (set by any thread)
        self._on_error = on_error
        self.producer = Producer({**config, "error_cb": self._error})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll_loop, name="kafka-producer-poll",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def mark(self, err: KafkaError) -> None:
        """Note `err` (from a delivery report, the error callback or produce())."""
        if self.unusable is None:
            self.unusable = unusable_reason(err)

    def _error(self, err: KafkaError) -> None:
        self.mark(err)
        self._on_error(err)

    def _poll_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.producer.poll(0.1)
            except Exception:  # a callback bug must not kill delivery reports
                log.exception("kafka producer poll failed")
                self._stop.wait(0.5)

    def close(self, flush_s: float) -> int:
        """Deliver what it holds (within `flush_s`) and stop; blocks. Returns how many
        messages were left undelivered."""
        remaining = int(self.producer.flush(flush_s))
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        return remaining

    def discard(self) -> None:
        """Fail every message it still holds at once (their batches go the direct path) and
        stop; blocks."""
        self.producer.purge(in_queue=True, in_flight=True, blocking=False)
        self.close(_DISCARD_FLUSH_S)


def _delivery_callback(batch: PublishBatch, index: int, polled: _PolledProducer) -> Any:
    def on_delivery(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            polled.mark(err)
        batch.resolve(index, None if err is None else f"kafka: {err.str()}")

    return on_delivery


class KafkaPublisher(Publisher):
    kind = BrokerKind.KAFKA

    def __init__(
        self,
        bootstrap: str,
        *,
        cluster: str = DEFAULT_CLUSTER,
        acks: str = "all",
        linger_ms: int = 2,
        publish_timeout_ms: int = 30_000,
        connect_timeout_s: float = 10.0,
        extra_config: dict[str, Any] | None = None,
        replication_factor: int | None = None,
        min_insync_replicas: int | None = None,
    ) -> None:
        """`replication_factor`, `min_insync_replicas`: what new topics are created with;
        None sends nothing, and the broker's defaults apply."""
        self._bootstrap = bootstrap
        self._replication_factor = replication_factor
        self._topic_config = ({} if min_insync_replicas is None
                              else {"min.insync.replicas": str(min_insync_replicas)})
        self.cluster = cluster
        self._publish_timeout_ms = publish_timeout_ms
        self._connect_timeout_s = connect_timeout_s
        self._extra = dict(extra_config or {})
        self._config: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            # no duplicates or reordering on retries; librdkafka requires acks=all for it
            "enable.idempotence": acks in ("all", "-1"),
            "acks": acks,
            "linger.ms": linger_ms,
            "message.timeout.ms": publish_timeout_ms,
            "partitioner": "murmur2_random",  # the Java client's key hashing
            **self._extra,
        }
        self._polled: _PolledProducer | None = None
        self._admin: AdminClient | None = None
        self._replacing = asyncio.Lock()
        self._replaced_at = -REPLACE_MIN_INTERVAL_S
        self.replacements = 0  # producers replaced because they could publish no more
        # Set by librdkafka's "all brokers down": publishes then fail at once (their messages
        # go the direct path) instead of each waiting message.timeout.ms, until a probe of
        # the cluster succeeds.
        self._all_down = False
        self._next_probe_at = 0.0

    def _on_error(self, err: KafkaError) -> None:
        if err.code() == KafkaError._ALL_BROKERS_DOWN:
            self._all_down = True
        log.warning("kafka producer: %s", err.str())

    async def _reachable(self) -> bool:
        """False while every broker is down (probed at most every few seconds)."""
        if not self._all_down:
            return True
        if time.monotonic() < self._next_probe_at or self._admin is None:
            return False
        try:
            await asyncio.to_thread(self._admin.list_topics, timeout=_PROBE_TIMEOUT_S)
        except KafkaException:
            self._next_probe_at = time.monotonic() + _PROBE_EVERY_S
            return False
        self._all_down = False
        log.info("kafka at %s is reachable again", self._bootstrap)
        return True

    async def start(self) -> None:
        if self._polled is not None:
            return
        try:
            polled = _PolledProducer(self._config, self._on_error)
            admin = AdminClient({"bootstrap.servers": self._bootstrap, **self._extra})
        except (KafkaException, ValueError, TypeError) as exc:
            raise BrokerError(f"kafka producer config: {exc}") from exc
        try:
            await asyncio.to_thread(admin.list_topics, timeout=self._connect_timeout_s)
        except KafkaException as exc:
            raise BrokerError(f"kafka at {self._bootstrap} unreachable: {exc}") from exc
        polled.start()
        self._polled, self._admin = polled, admin

    def _require(self) -> _PolledProducer:
        if self._polled is None:
            raise BrokerError("KafkaPublisher is not started")
        return self._polled

    async def _usable(self) -> _PolledProducer:
        """The producer to publish with: one that can publish no more is replaced first (at
        most every REPLACE_MIN_INTERVAL_S; until then its publishes fail and go direct)."""
        polled = self._require()
        if (polled.unusable is None
                or time.monotonic() < self._replaced_at + REPLACE_MIN_INTERVAL_S):
            return polled
        async with self._replacing:
            if self._polled is polled:  # not replaced by a concurrent publish meanwhile
                await self._replace(polled)
        return self._require()

    async def _replace(self, old: _PolledProducer) -> None:
        log.warning("kafka producer at %s can publish no more (%s); replacing it with a new "
                    "one", self._bootstrap, old.unusable)
        new = _PolledProducer(self._config, self._on_error)
        new.start()
        self._polled, self._replaced_at = new, time.monotonic()
        self.replacements += 1
        await asyncio.to_thread(old.discard)

    async def ensure_topology(
        self, destination: Destination, subscriptions: Sequence[Subscription]
    ) -> None:
        """Create the destination's topic; consumer groups need no setup in Kafka."""
        if self._admin is None:
            raise BrokerError("KafkaPublisher is not started")
        await asyncio.to_thread(
            self._create_topic, self._admin, topic_name(destination.code), destination.partitions
        )

    def new_topic(self, topic: str, partitions: int) -> NewTopic:
        """The CreateTopics request of a destination's topic (-1: the broker's default)."""
        return NewTopic(topic, num_partitions=partitions,
                        replication_factor=self._replication_factor or -1,
                        config=dict(self._topic_config))

    def _create_topic(self, admin: AdminClient, topic: str, partitions: int) -> None:
        """An existing topic is left as it is: its replication is reported, not changed
        (msgbus/replication.py; docs/operations.md)."""
        new = self.new_topic(topic, partitions)
        futures = admin.create_topics([new], operation_timeout=self._connect_timeout_s)
        try:
            futures[topic].result(timeout=self._connect_timeout_s + 5)
            log.info("kafka topic %s created with %d partitions (replication factor %s, "
                     "config %s)", topic, partitions, self._replication_factor or "default",
                     self._topic_config or "default")
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                return
            raise BrokerError(f"kafka: cannot create topic {topic}: {exc}") from exc
        except Exception as exc:  # concurrent.futures.TimeoutError and the like
            raise BrokerError(f"kafka: cannot create topic {topic}: {exc!r}") from exc

    async def publish(
        self, destination: Destination, envelopes: Sequence[Envelope]
    ) -> list[PublishOutcome]:
        if not envelopes:
            return []
        polled = await self._usable()
        if not await self._reachable():
            return [PublishOutcome(e.message_id, "kafka: all brokers are down") for e in envelopes]
        topic = topic_name(destination.code)
        batch = PublishBatch(asyncio.get_running_loop(), envelopes)
        deadline = time.monotonic() + self._publish_timeout_ms / 1000
        for index, envelope in enumerate(envelopes):
            callback = _delivery_callback(batch, index, polled)
            error = await self._produce(polled, topic, envelope, callback, deadline)
            if error is not None:
                batch.resolve(index, error)
            if index % _PRODUCE_CHUNK == _PRODUCE_CHUNK - 1:
                await asyncio.sleep(0)
        # librdkafka reports every message within message.timeout.ms; the margin is a safety net.
        wait_s = max(0.0, deadline - time.monotonic()) + 5.0
        try:
            await asyncio.wait_for(asyncio.shield(batch.done), wait_s)
        except TimeoutError:
            log.warning("kafka: publish to %s timed out waiting for delivery reports", topic)
        return batch.seal("kafka: delivery not acknowledged in time")

    async def _produce(
        self, polled: _PolledProducer, topic: str, envelope: Envelope, on_delivery: Any,
        deadline: float,
    ) -> str | None:
        """Enqueue one record; returns an error text instead of raising."""
        try:
            value = codec.encode(envelope)
        except Exception as exc:
            return f"encode: {exc!r}"
        while True:
            try:
                polled.producer.produce(
                    topic, value=value, key=_message_key(envelope), on_delivery=on_delivery
                )
                return None
            except BufferError:  # local queue full: the poll thread empties it
                if time.monotonic() > deadline:
                    return "kafka: local producer queue full"
                await asyncio.sleep(0.005)
            except KafkaException as exc:
                if isinstance(exc.args[0] if exc.args else None, KafkaError):
                    polled.mark(exc.args[0])
                return f"kafka: {exc}"

    async def close(self) -> None:
        polled, self._polled = self._polled, None
        if polled is None:
            return
        remaining = await asyncio.to_thread(polled.close, _CLOSE_FLUSH_S)
        if remaining:
            log.warning("kafka producer closed with %d messages undelivered", remaining)
        self._admin = None


def committed_offsets(admin: AdminClient, group: str, parts: list[tuple[str, int]],
                      timeout_s: float) -> dict[tuple[str, int], int]:
    """`group`'s committed offset of each of `parts` (topic, partition) that has one."""
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(t, p) for t, p in parts])
    futures = admin.list_consumer_group_offsets([request], request_timeout=timeout_s)
    result = futures[group].result(timeout=timeout_s)
    return {(tp.topic, tp.partition): tp.offset for tp in result.topic_partitions
            if tp.error is None and tp.offset >= 0}
