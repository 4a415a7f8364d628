"""From the receiver's buffer to broker and MongoDB.

`Intake.accept()` (receiver/intake.py) wrote each message to two queues of the local LMDB
buffer. Two flushers empty them independently:
- "publish" (partitioned by destination, each flushed by a task of its own, so that a broker
  that is down never holds back the destinations on other brokers): claims their ids against
  the other receivers' (`receiver.dedupe`, one write per batch), sends messages to their
  destination's broker; what the broker refuses goes the
  direct path to a dispatcher; what that refuses too stays pending in MongoDB for the
  compensator (its record is already buffered, so it is never lost);
- "record" (partitioned by destination): writes the messages and their pending batches to
  MongoDB in batches, at the rates the runtime settings allow (`RecordWriter`).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict

from msgbus import telemetry
from msgbus.brokers.base import Publisher
from msgbus.codec import decode_cooperatively
from msgbus.delivery.filters import subscription_receives
from msgbus.errors import NotFound
from msgbus.flush import PartitionedFlusher
from msgbus.localqueue import LocalQueue
from msgbus.metrics import DIRECT_FALLBACKS, PUBLISH_LATENCY, PUBLISHED, RECORD_RATE_LIMIT
from msgbus.models import BrokerKind, Destination, Envelope, Subscription, utcnow
from msgbus.registry import Registry
from msgbus.store import MongoStore
from receiver.dedupe import AcceptedIds
from receiver.intake import PUBLISH_QUEUE, RECORD_QUEUE, queue_depths
from receiver.publishers import PublisherSet
from receiver.recording import RecordWriter

log = logging.getLogger(__name__)


class IngestPipeline:
    def __init__(
        self, buffer: LocalQueue, store: MongoStore, registry: Registry,
        publishers: PublisherSet, *, publish_batch: int, record_batch: int,
        default_record_rate_per_s: float = 0, accepted_ids: AcceptedIds | None = None,
    ) -> None:
        """`accepted_ids`: the cross-receiver de-duplication of what is published (None:
        none)."""
        self._buffer, self._store, self._registry = buffer, store, registry
        self._publishers, self._accepted_ids = publishers, accepted_ids
        self._default_record_rate = default_record_rate_per_s
        # what the buffer held before this pipeline existed a predecessor may have published
        self._opened_at = utcnow()
        self._topology_done: set[tuple[str, BrokerKind, str, tuple[str, ...]]] = set()
        self._flushers = [
            PartitionedFlusher(buffer, PUBLISH_QUEUE, self._publish,
                               batch_size=publish_batch),
            RecordWriter(buffer, RECORD_QUEUE, self._record, batch_size=record_batch,
                         global_rate=self.global_record_rate, rate_of=self.record_rate_of,
                         ready=store.gate.wait_available),
        ]

    def start(self) -> None:
        self._registry.on_change(self.prepare_topology)
        for flusher in self._flushers:
            flusher.start()

    async def prepare_topology(self) -> None:
        """Create topics, exchanges and subscription queues as soon as a destination or
        subscription appears, so that consumers find them before the first message."""
        for destination in self._registry.destinations():
            publisher = self._publishers.for_destination(destination, self._registry.runtime())
            if not await self._publishers.ready(publisher):
                continue
            try:
                await self._ensure_topology(publisher, destination)
            except Exception as exc:  # the publish path retries it
                log.warning("preparing %s on %s failed: %s", destination.code,
                            publisher.kind, exc)

    async def close(self) -> None:
        self._registry.remove_listener(self.prepare_topology)
        for flusher in self._flushers:
            await flusher.close()

    def depths(self) -> dict[str, int]:
        """Entries waiting per queue of the buffer this pipeline flushes."""
        return queue_depths(self._buffer)

    # --- record rates (runtime settings, then this receiver's default) -------------------

    def global_record_rate(self) -> float:
        rate = self._registry.runtime().record_rate_per_s
        rate = self._default_record_rate if rate is None else rate
        RECORD_RATE_LIMIT.labels("*").set(rate)
        return rate

    def record_rate_of(self, code: str) -> float:
        destination = self._registry.known_destination(code)
        if destination is None:
            return 0.0
        RECORD_RATE_LIMIT.labels(code).set(destination.record_rate_per_s)
        return destination.record_rate_per_s

    # --- sinks ---------------------------------------------------------------------------

    async def _record(self, entries: list[bytes]) -> None:
        records = []
        subscriptions: dict[str, list[Subscription]] = {}  # per destination, for this batch
        for envelope in await decode_cooperatively(entries):
            of_destination = subscriptions.get(envelope.destination)
            if of_destination is None:
                of_destination = subscriptions[envelope.destination] = (
                    self._registry.subscriptions_of(envelope.destination))
            subs = [s.id for s in of_destination if subscription_receives(s, envelope)]
            records.append((envelope, subs))
        await self._store.records.record_messages(records)

    async def _publish(self, entries: list[bytes]) -> None:
        by_destination: dict[str, list[Envelope]] = defaultdict(list)
        envelopes = await decode_cooperatively(entries)
        if self._accepted_ids is not None:
            envelopes = await self._accepted_ids.first_accepts(envelopes)
        for envelope in envelopes:
            if envelope.received_at is None or envelope.received_at < self._opened_at:
                envelope.redelivered = True
            by_destination[envelope.destination].append(envelope)
        for code, envelopes in by_destination.items():
            try:
                destination = await self._registry.destination(code)
            except NotFound:
                log.warning("destination %s was deleted; %d messages are recorded but not "
                            "published", code, len(envelopes))
                continue
            await self._publish_to_destination(destination, envelopes)

    async def _publish_to_destination(self, destination: Destination,
                                      envelopes: list[Envelope]) -> None:
        publisher = self._publishers.for_destination(destination, self._registry.runtime())
        refused = envelopes
        if publisher.kind is not BrokerKind.DIRECT:
            refused = await self._publish_with(publisher, destination, envelopes)
            if not refused:
                return
            DIRECT_FALLBACKS.labels(destination.code, publisher.kind.value).inc(len(refused))
        refused = await self._publish_with(self._publishers.direct, destination, refused)
        if refused:
            log.error("direct path refused %d messages of %s; they stay pending for the "
                      "compensator", len(refused), destination.code)

    async def _publish_with(self, publisher: Publisher, destination: Destination,
                            envelopes: list[Envelope]) -> list[Envelope]:
        """Publishes; returns the envelopes the broker did not confirm."""
        labels = (publisher.kind.value, publisher.cluster)
        started = time.perf_counter()
        try:
            if not await self._publishers.ready(publisher):
                PUBLISHED.labels(*labels, "unreachable").inc(len(envelopes))
                return envelopes
            await self._ensure_topology(publisher, destination)
            with telemetry.batch_span("msgbus publish", envelopes):
                outcomes = await publisher.publish(destination, envelopes)
        except Exception as exc:
            log.warning("publishing to %s (%s) failed: %s", *labels, exc)
            PUBLISHED.labels(*labels, "error").inc(len(envelopes))
            return envelopes
        PUBLISH_LATENCY.labels(*labels).observe(time.perf_counter() - started)
        errors = {o.message_id: o.error for o in outcomes if not o.ok}
        PUBLISHED.labels(*labels, "ok").inc(len(envelopes) - len(errors))
        PUBLISHED.labels(*labels, "error").inc(len(errors))
        if errors:
            log.warning("%s (%s) refused %d messages of %s (e.g. %s)%s", *labels, len(errors),
                        destination.code, next(iter(errors.values())),
                        "" if publisher.kind is BrokerKind.DIRECT
                        else "; handing them to the direct path")
        return [e for e in envelopes if e.message_id in errors]

    async def _ensure_topology(self, publisher: Publisher, destination: Destination) -> None:
        subs = self._registry.subscriptions_of(destination.code)
        key = (destination.code, publisher.kind, publisher.cluster, tuple(s.name for s in subs))
        if key not in self._topology_done:
            await publisher.ensure_topology(destination, subs)
            self._topology_done.add(key)
