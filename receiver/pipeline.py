"""From acceptance to broker and MongoDB.

`accept()` is the durability point: it writes each message to two queues of the local LMDB
buffer in one fsync'd transaction. Two drainers then work independently:
- "publish": sends messages to their destination's broker; what the broker refuses goes the
  direct path to a dispatcher; what that refuses too stays pending in MongoDB for the
  compensator (its record is already buffered, so it is never lost);
- "record": writes the messages and their pending deliveries to MongoDB in batches.
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from collections.abc import Mapping

from msgbus.brokers.base import Publisher
from msgbus.codec import decode, encode
from msgbus.drain import Drainer
from msgbus.errors import NotFound
from msgbus.localqueue import Item, LocalQueue
from msgbus.metrics import BUFFER_DEPTH, MESSAGES_ACCEPTED, MESSAGES_DUPLICATE, PUBLISHED
from msgbus.models import BrokerKind, Destination, Envelope
from msgbus.registry import Registry
from msgbus.store import MongoStore

log = logging.getLogger(__name__)

PUBLISH_QUEUE = "publish"
RECORD_QUEUE = "record"
QUEUES = (PUBLISH_QUEUE, RECORD_QUEUE)


class IngestPipeline:
    def __init__(
        self, buffer: LocalQueue, store: MongoStore, registry: Registry,
        publishers: Mapping[BrokerKind, Publisher], *, publish_batch: int, record_batch: int,
    ) -> None:
        if BrokerKind.DIRECT not in publishers:
            raise ValueError("the direct publisher is required: it is every broker's fallback")
        self._buffer = buffer
        self._store = store
        self._registry = registry
        self._publishers = publishers
        self._topology_done: set[tuple[str, BrokerKind, tuple[str, ...]]] = set()
        self._warned_unconfigured: set[str] = set()
        self._drainers = [
            Drainer(buffer, PUBLISH_QUEUE, self._publish, batch_size=publish_batch),
            Drainer(buffer, RECORD_QUEUE, self._record, batch_size=record_batch),
        ]

    def start(self) -> None:
        self._registry.on_change(self.prepare_topology)
        for drainer in self._drainers:
            drainer.start()

    async def prepare_topology(self) -> None:
        """Create topics, exchanges and subscription queues as soon as a destination or
        subscription appears, so that consumers find them before the first message."""
        for destination in self._registry.destinations():
            publisher = self._publisher_for(destination)
            try:
                await self._ensure_topology(publisher, destination)
            except Exception as exc:  # the publish path retries it
                log.warning("preparing %s on %s failed: %s", destination.code,
                            publisher.kind, exc)

    async def close(self) -> None:
        for drainer in self._drainers:
            await drainer.close()

    async def accept(self, envelopes: list[Envelope]) -> list[bool]:
        """Buffer the messages durably; per message, False when this receiver accepted the
        same message_id within its dedupe window (a client re-send): it is not queued again."""
        items: list[Item] = []
        for envelope in envelopes:
            data = encode(envelope)
            items.append((uuid.UUID(envelope.message_id).bytes,
                          [(PUBLISH_QUEUE, data), (RECORD_QUEUE, data)]))
        fresh = await self._buffer.append_new(items)
        for envelope, is_new in zip(envelopes, fresh, strict=True):
            counter = MESSAGES_ACCEPTED if is_new else MESSAGES_DUPLICATE
            counter.labels(envelope.destination).inc()
        return fresh

    def depths(self) -> dict[str, int]:
        depths = {q: self._buffer.depth(q) for q in QUEUES}
        for queue, depth in depths.items():
            BUFFER_DEPTH.labels("receiver", queue).set(depth)
        return depths

    # --- sinks ---------------------------------------------------------------------------

    async def _record(self, entries: list[bytes]) -> None:
        records = []
        for envelope in map(decode, entries):
            accepted = envelope.received_at or envelope.created_at
            subs = [s.id for s in self._registry.subscriptions_of(envelope.destination)
                    if s.created_at <= accepted]  # the same rule as the dispatcher's
            records.append((envelope, subs))
        await self._store.record_messages(records)

    async def _publish(self, entries: list[bytes]) -> None:
        by_destination: dict[str, list[Envelope]] = defaultdict(list)
        for envelope in map(decode, entries):
            by_destination[envelope.destination].append(envelope)
        for code, envelopes in by_destination.items():
            try:
                destination = await self._registry.destination(code)
            except NotFound:
                log.warning("destination %s was deleted; %d messages are recorded but not "
                            "published", code, len(envelopes))
                continue
            await self._publish_to_destination(destination, envelopes)

    def _publisher_for(self, destination: Destination) -> Publisher:
        publisher = self._publishers.get(destination.broker)
        if publisher is not None:
            return publisher
        if destination.code not in self._warned_unconfigured:
            self._warned_unconfigured.add(destination.code)  # once, not on every batch
            log.warning("broker %s of destination %s is not configured; using direct",
                        destination.broker, destination.code)
        return self._publishers[BrokerKind.DIRECT]

    async def _publish_to_destination(self, destination: Destination,
                                      envelopes: list[Envelope]) -> None:
        publisher = self._publisher_for(destination)
        refused = envelopes
        if publisher.kind is not BrokerKind.DIRECT:
            refused = await self._publish_with(publisher, destination, envelopes)
            if not refused:
                return
            log.warning("%s refused %d messages of %s; handing them to the direct path",
                        publisher.kind, len(refused), destination.code)
        refused = await self._publish_with(self._publishers[BrokerKind.DIRECT], destination,
                                           refused)
        if refused:
            log.error("direct path refused %d messages of %s; they stay pending for the "
                      "compensator", len(refused), destination.code)

    async def _publish_with(self, publisher: Publisher, destination: Destination,
                            envelopes: list[Envelope]) -> list[Envelope]:
        """Publishes; returns the envelopes the broker did not confirm."""
        try:
            await self._ensure_topology(publisher, destination)
            outcomes = await publisher.publish(destination, envelopes)
        except Exception as exc:
            log.warning("publishing to %s failed: %s", publisher.kind, exc)
            PUBLISHED.labels(publisher.kind.value, "error").inc(len(envelopes))
            return envelopes
        failed_ids = {o.message_id for o in outcomes if not o.ok}
        PUBLISHED.labels(publisher.kind.value, "ok").inc(len(envelopes) - len(failed_ids))
        PUBLISHED.labels(publisher.kind.value, "error").inc(len(failed_ids))
        return [e for e in envelopes if e.message_id in failed_ids]

    async def _ensure_topology(self, publisher: Publisher, destination: Destination) -> None:
        subs = self._registry.subscriptions_of(destination.code)
        key = (destination.code, publisher.kind, tuple(s.name for s in subs))
        if key not in self._topology_done:
            await publisher.ensure_topology(destination, subs)
            self._topology_done.add(key)
