"""`FlushService`: everything that flushes receiver buffers into the brokers and MongoDB — the
publishers, the ingest pipeline of one buffer, and the adopter of buffers that dead receivers
left behind. It runs inside the receiver (`flusher="inline"`) or in a flush process of its own
(receiver/flush_process.py), where its CPU never delays an answer to a producer."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from msgbus.localqueue import LocalQueue
from msgbus.registry import Registry
from msgbus.settings import ReceiverSettings
from msgbus.store import MongoStore
from receiver.adoption import OrphanAdopter
from receiver.dedupe import AcceptedIds, buffer_origin
from receiver.intake import QUEUES
from receiver.pipeline import IngestPipeline
from receiver.publishers import PublisherSet, build_publishers

log = logging.getLogger(__name__)


def open_buffer(settings: ReceiverSettings, path: Path,
                on_commit: Callable[[], None] | None = None) -> LocalQueue:
    """A receiver buffer at `path`: a receiver's own slot, or an orphan being adopted."""
    return LocalQueue(path, QUEUES, max_bytes=settings.buffer_max_bytes,
                      dedupe_window_s=settings.dedupe_window_s, on_commit=on_commit)


def make_pipeline(settings: ReceiverSettings, store: MongoStore, registry: Registry,
                  publishers: PublisherSet, buffer: LocalQueue) -> IngestPipeline:
    return IngestPipeline(
        buffer, store, registry, publishers,
        publish_batch=settings.publish_batch_size, record_batch=settings.mongo_batch_size,
        default_record_rate_per_s=settings.record_rate_per_s,
        accepted_ids=(AcceptedIds(store, settings.dedupe_window_s, buffer_origin(buffer.path))
                      if settings.dedupe_across_receivers else None),
    )


class FlushService:
    def __init__(self, settings: ReceiverSettings, store: MongoStore, registry: Registry,
                 buffer: LocalQueue, buffer_root: Path) -> None:
        self.settings = settings
        self._store = store
        self._registry = registry
        self.buffer = buffer
        self.publishers = PublisherSet(build_publishers(settings))
        self.pipeline = self.pipeline_on(buffer)
        self.adopter = OrphanAdopter(buffer_root, lambda path: open_buffer(settings, path),
                                     self.pipeline_on, scan_s=settings.orphan_scan_s,
                                     min_idle_s=settings.orphan_min_idle_s)

    def pipeline_on(self, buffer: LocalQueue) -> IngestPipeline:
        """The ingest pipeline that flushes `buffer` (the receiver's, or an adopted one)."""
        return make_pipeline(self.settings, self._store, self._registry, self.publishers,
                             buffer)

    async def start(self) -> None:
        """Starts even while a broker is down: it is retried, its messages go direct."""
        await self.publishers.start()
        self.pipeline.start()
        await self.pipeline.prepare_topology()
        self.adopter.start()
        log.info("receiver flush ready (publishers: %s)", ", ".join(self.publishers.kinds()))

    async def close(self) -> None:
        await self.adopter.close()
        await self.pipeline.close()
        await self.publishers.close()
