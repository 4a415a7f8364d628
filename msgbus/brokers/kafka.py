"""Kafka adapter (confluent-kafka): a destination is a topic, a subscription a consumer group.

Publisher: one idempotent producer (acks=all by default); records are keyed by `biz_id` (else
`message_id`) so all messages of one business key stay in one partition, in order. A poll
thread serves delivery reports and resolves each publish batch's asyncio future through
`call_soon_threadsafe`. New topics get the configured replication factor and
min.insync.replicas.

Consumer: `KafkaSubscriptionConsumer` (in `_kafka_consumer`, re-exported here).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer
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


def _message_key(envelope: Envelope) -> bytes:
    return (envelope.biz_id if envelope.biz_id is not None else envelope.message_id).encode()


def _delivery_callback(batch: PublishBatch, index: int) -> Any:
    def on_delivery(err: KafkaError | None, _msg: Message) -> None:
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
            "error_cb": self._on_error,
            **self._extra,
        }
        self._producer: Producer | None = None
        self._admin: AdminClient | None = None
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None
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
        if self._producer is not None:
            return
        try:
            producer = Producer(self._config)
            admin = AdminClient({"bootstrap.servers": self._bootstrap, **self._extra})
        except (KafkaException, ValueError, TypeError) as exc:
            raise BrokerError(f"kafka producer config: {exc}") from exc
        try:
            await asyncio.to_thread(admin.list_topics, timeout=self._connect_timeout_s)
        except KafkaException as exc:
            raise BrokerError(f"kafka at {self._bootstrap} unreachable: {exc}") from exc
        self._producer, self._admin = producer, admin
        self._stop.clear()
        self._poller = threading.Thread(
            target=self._poll_loop, args=(producer,), name="kafka-producer-poll", daemon=True
        )
        self._poller.start()

    def _poll_loop(self, producer: Producer) -> None:
        while not self._stop.is_set():
            try:
                producer.poll(0.1)
            except Exception:  # a callback bug must not kill delivery reports
                log.exception("kafka producer poll failed")
                self._stop.wait(0.5)

    def _require(self) -> Producer:
        if self._producer is None:
            raise BrokerError("KafkaPublisher is not started")
        return self._producer

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
        producer = self._require()
        if not await self._reachable():
            return [PublishOutcome(e.message_id, "kafka: all brokers are down") for e in envelopes]
        topic = topic_name(destination.code)
        batch = PublishBatch(asyncio.get_running_loop(), envelopes)
        deadline = time.monotonic() + self._publish_timeout_ms / 1000
        for index, envelope in enumerate(envelopes):
            callback = _delivery_callback(batch, index)
            error = await self._produce(producer, topic, envelope, callback, deadline)
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
        self, producer: Producer, topic: str, envelope: Envelope, on_delivery: Any,
        deadline: float,
    ) -> str | None:
        """Enqueue one record; returns an error text instead of raising."""
        try:
            value = codec.encode(envelope)
        except Exception as exc:
            return f"encode: {exc!r}"
        while True:
            try:
                producer.produce(
                    topic, value=value, key=_message_key(envelope), on_delivery=on_delivery
                )
                return None
            except BufferError:  # local queue full: the poll thread drains it
                if time.monotonic() > deadline:
                    return "kafka: local producer queue full"
                await asyncio.sleep(0.005)
            except KafkaException as exc:
                return f"kafka: {exc}"

    async def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is None:
            return
        remaining = await asyncio.to_thread(producer.flush, 10.0)
        if remaining:
            log.warning("kafka producer closed with %d messages undelivered", remaining)
        self._stop.set()
        if self._poller is not None:
            await asyncio.to_thread(self._poller.join)
            self._poller = None
        self._admin = None
