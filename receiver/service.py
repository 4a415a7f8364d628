"""`ReceiverService`: the receiver's parts, wired from its settings."""

from __future__ import annotations

import logging

from msgbus.brokers.base import Publisher
from msgbus.brokers.direct import DirectPublisher
from msgbus.localqueue import LocalQueue
from msgbus.models import BrokerKind
from msgbus.registry import Registry
from msgbus.settings import ReceiverSettings
from msgbus.store import MongoStore
from receiver.pipeline import QUEUES, IngestPipeline
from receiver.producers import ProducerAuthenticator

log = logging.getLogger(__name__)


def build_publishers(settings: ReceiverSettings) -> dict[BrokerKind, Publisher]:
    conn = settings.connections
    publishers: dict[BrokerKind, Publisher] = {
        BrokerKind.DIRECT: DirectPublisher(settings.dispatcher_url,
                                           conn.internal_token.get_secret_value()),
    }
    if conn.kafka_bootstrap:
        from msgbus.brokers.kafka import KafkaPublisher

        publishers[BrokerKind.KAFKA] = KafkaPublisher(conn.kafka_bootstrap)
    if conn.rabbitmq_url:
        from msgbus.brokers.rabbitmq import RabbitPublisher

        publishers[BrokerKind.RABBITMQ] = RabbitPublisher(conn.rabbitmq_url)
    return publishers


class ReceiverService:
    def __init__(self, settings: ReceiverSettings) -> None:
        conn = settings.connections
        if not conn.internal_token.get_secret_value():
            raise ValueError("MSGBUS_INTERNAL_TOKEN is not set (the direct path needs it)")
        self.settings = settings
        self.store = MongoStore(conn.mongo_uri, conn.mongo_db)
        self.registry = Registry(self.store, refresh_s=conn.config_refresh_s)
        self.auth = ProducerAuthenticator(self.store)
        self.publishers = build_publishers(settings)
        buffer_dir = settings.buffer_dir or conn.state_dir / "receiver-buffer"
        self.buffer = LocalQueue(buffer_dir, QUEUES, max_bytes=settings.buffer_max_bytes,
                                 dedupe_window_s=settings.dedupe_window_s)
        self.pipeline = IngestPipeline(
            self.buffer, self.store, self.registry, self.publishers,
            publish_batch=settings.publish_batch_size, record_batch=settings.mongo_batch_size,
        )

    async def start(self) -> None:
        await self.store.ensure_indexes()
        await self.registry.start()
        for publisher in self.publishers.values():
            await publisher.start()
        self.pipeline.start()
        await self.pipeline.prepare_topology()
        log.info("receiver ready (brokers: %s)", ", ".join(p.value for p in self.publishers))

    async def close(self) -> None:
        await self.pipeline.close()
        for publisher in self.publishers.values():
            await publisher.close()
        await self.registry.close()
        await self.store.close()
        self.buffer.close()
