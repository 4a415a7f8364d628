"""`ReceiverService`: the receiver's parts, wired from its settings."""

from __future__ import annotations

import logging
from pathlib import Path

from pymongo.errors import PyMongoError

from msgbus.bufferslots import claim_slot
from msgbus.localqueue import LocalQueue
from msgbus.registry import Registry
from msgbus.settings import ReceiverSettings
from msgbus.store import MongoStore
from receiver.adoption import OrphanAdopter
from receiver.pipeline import QUEUES, IngestPipeline
from receiver.producers import ProducerAuthenticator
from receiver.publishers import PublisherSet, build_publishers

log = logging.getLogger(__name__)


class ReceiverService:
    def __init__(self, settings: ReceiverSettings) -> None:
        conn = settings.connections
        if not conn.internal_token.get_secret_value():
            raise ValueError("MSGBUS_INTERNAL_TOKEN is not set (the direct path needs it)")
        self.settings = settings
        self.store = MongoStore(conn.mongo_uri, conn.mongo_db)
        self.registry = Registry(self.store, refresh_s=conn.config_refresh_s)
        self.auth = ProducerAuthenticator(self.store)
        self.publishers = PublisherSet(build_publishers(settings))
        # several receivers may share the buffer root: each owns one slot of it
        buffer_root = settings.buffer_dir or conn.state_dir / "receiver-buffer"
        self.slot = claim_slot(buffer_root)
        self.buffer = self.open_buffer(self.slot.path)
        self.pipeline = self.pipeline_on(self.buffer)
        self.adopter = OrphanAdopter(buffer_root, self.open_buffer, self.pipeline_on,
                                     scan_s=settings.orphan_scan_s,
                                     min_idle_s=settings.orphan_min_idle_s)

    def open_buffer(self, path: Path) -> LocalQueue:
        """A receiver buffer at `path`: this receiver's own slot, or an orphan it adopts."""
        return LocalQueue(path, QUEUES, max_bytes=self.settings.buffer_max_bytes,
                          dedupe_window_s=self.settings.dedupe_window_s)

    def pipeline_on(self, buffer: LocalQueue) -> IngestPipeline:
        """The ingest pipeline that drains `buffer` (this receiver's, or an adopted one)."""
        settings = self.settings
        return IngestPipeline(
            buffer, self.store, self.registry, self.publishers,
            publish_batch=settings.publish_batch_size, record_batch=settings.mongo_batch_size,
            default_record_rate_per_s=settings.record_rate_per_s,
        )

    async def start(self) -> None:
        """Starts even while MongoDB or a broker is down: what is buffered drains when they
        are back, and producers the receiver knows keep sending."""
        try:
            await self.store.ensure_indexes()
        except PyMongoError as exc:
            log.warning("MongoDB is unreachable (%s); indexes are created at the next start",
                        type(exc).__name__)
        await self.registry.start()
        await self.publishers.start()
        self.pipeline.start()
        await self.pipeline.prepare_topology()
        self.adopter.start()
        log.info("receiver ready (publishers: %s)", ", ".join(self.publishers.kinds()))

    async def close(self) -> None:
        await self.adopter.close()
        await self.auth.close()
        await self.pipeline.close()
        await self.publishers.close()
        await self.registry.close()
        await self.store.close()
        self.buffer.close()
        self.slot.release()
