"""`PublisherSet`: the receiver's publishers, one per configured cluster of each broker kind,
plus direct, and which one a destination publishes to right now.

A destination names its broker kind; the runtime settings name the active cluster of each kind
(switched through the admin API). A publisher that could not connect at start is retried on
use, at most every few seconds, so a broker that is down when the receiver starts never stops
it from starting; its messages go the direct path meanwhile.
"""

from __future__ import annotations

import logging
import time

from msgbus.brokers.base import Publisher
from msgbus.brokers.direct import DirectPublisher
from msgbus.errors import BrokerError
from msgbus.models import BrokerKind, Destination, RuntimeConfig
from msgbus.settings import ReceiverSettings

log = logging.getLogger(__name__)

RESTART_EVERY_S = 5.0


def build_publishers(settings: ReceiverSettings) -> list[Publisher]:
    conn = settings.connections
    publishers: list[Publisher] = [
        DirectPublisher(settings.dispatcher_url, conn.internal_token.get_secret_value())]
    for cluster, nodes in conn.clusters(BrokerKind.KAFKA).items():
        from msgbus.brokers.kafka import KafkaPublisher

        publishers.append(KafkaPublisher(
            ",".join(nodes), cluster=cluster, acks=settings.kafka_acks,
            publish_timeout_ms=settings.kafka_publish_timeout_ms,
            replication_factor=conn.kafka_replication_factor,
            min_insync_replicas=conn.kafka_min_insync_replicas))
    for cluster, nodes in conn.clusters(BrokerKind.RABBITMQ).items():
        from msgbus.brokers.rabbitmq import RabbitPublisher

        publishers.append(RabbitPublisher(
            nodes, cluster=cluster, confirm_timeout_s=settings.rabbitmq_confirm_timeout_s,
            queue_type=conn.rabbitmq_queue_type))
    return publishers


class PublisherSet:
    def __init__(self, publishers: list[Publisher]) -> None:
        self._all = {(p.kind, p.cluster): p for p in publishers}
        direct = [p for p in publishers if p.kind is BrokerKind.DIRECT]
        if not direct:
            raise ValueError("the direct publisher is required: it is every broker's fallback")
        self.direct = direct[0]
        self._first_cluster: dict[BrokerKind, str] = {}
        for publisher in publishers:
            self._first_cluster.setdefault(publisher.kind, publisher.cluster)
        self._down: dict[Publisher, float] = {}  # not started -> when to try again
        self._warned: set[tuple[str, str]] = set()

    def all(self) -> list[Publisher]:
        return list(self._all.values())

    def kinds(self) -> list[str]:
        return [f"{kind.value}:{cluster}" for kind, cluster in self._all]

    async def start(self) -> None:
        for publisher in self._all.values():
            await self._try_start(publisher)

    async def _try_start(self, publisher: Publisher) -> bool:
        try:
            await publisher.start()
        except BrokerError as exc:
            log.warning("%s cluster %s is unreachable (%s); its messages go the direct path "
                        "until it is back", publisher.kind.value, publisher.cluster, exc)
            self._down[publisher] = time.monotonic() + RESTART_EVERY_S
            return False
        self._down.pop(publisher, None)
        return True

    async def ready(self, publisher: Publisher) -> bool:
        """Whether `publisher` is started; retries a failed start when it is due."""
        due = self._down.get(publisher)
        if due is None:
            return True
        if due > time.monotonic():
            return False
        return await self._try_start(publisher)

    def active_cluster(self, kind: BrokerKind, runtime: RuntimeConfig) -> str | None:
        wanted = runtime.active_clusters.get(kind)
        configured = [cluster for k, cluster in self._all if k is kind]
        active = runtime.active_cluster(kind, configured)
        if wanted is None or active == wanted:
            return active
        if (kind.value, wanted) not in self._warned:
            self._warned.add((kind.value, wanted))
            log.warning("active %s cluster %r is not configured here; using %r", kind.value,
                        wanted, self._first_cluster.get(kind))
        return self._first_cluster.get(kind)

    def for_destination(self, destination: Destination, runtime: RuntimeConfig) -> Publisher:
        """The publisher of the destination's broker, on that kind's active cluster; direct
        when that broker is not configured here."""
        cluster = self.active_cluster(destination.broker, runtime)
        publisher = self._all.get((destination.broker, cluster or ""))
        if publisher is not None:
            return publisher
        if (destination.code, "") not in self._warned:
            self._warned.add((destination.code, ""))  # once, not on every batch
            log.warning("broker %s of destination %s is not configured; using direct",
                        destination.broker, destination.code)
        return self.direct

    async def close(self) -> None:
        for publisher in self._all.values():
            await publisher.close()
