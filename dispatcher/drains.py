"""`DrainWatch`: after a destination switches brokers, what the old broker still holds is
delivered — consumed until it is empty for every subscription, not for a fixed time, for any
sequence of switches (A→B→C→A).

A destination's `retired` brokers (oldest first) are consumed beside the current one by every
subscription that existed when each was retired, until that subscription has drained it: a
`drains` document per (destination, retired broker, subscription) says so. Every
`drain_check_interval_s` each dispatcher looks at the retired brokers of the subscriptions it
serves, once a retirement is `drain_settle_s` old (receivers publish to the new broker after one
registry refresh; a publish already under way when they switched lands in the old one):
- Kafka: drained when the subscription's consumer group has committed every partition of the
  topic up to its end (commits follow the recorded outcomes, so nothing is left in flight);
- RabbitMQ: a queue with nothing ready is let go by this dispatcher (its worker stops consuming
  it and acks what it has in flight); drained when nothing is ready and no consumer is left —
  every dispatcher let go, and what a dying one held came back as ready, which makes them all
  consume it again.
Once every such subscription drained a retired broker, it leaves the destination. A paused
subscription has no worker, so its old backlog waits until it is resumed.

An ordered subscription consumes only its oldest undrained broker (none while a RabbitMQ queue is
being confirmed empty), then the next, then the current one: a key's old messages are pushed
before its new ones. The same holds for cluster switches (`PATCH /v1/runtime`
`active_clusters`; the runtime's `retired_clusters`): an ordered subscription drains a retired
cluster of its broker before it consumes the active one. Other subscriptions consume every
configured cluster of their brokers all the time, which drains any cluster.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import pika
from confluent_kafka import Consumer, TopicPartition

from msgbus.brokers._rabbit_consumer import short_lived_connection
from msgbus.brokers.base import consumer_name, topic_name
from msgbus.models import (
    BrokerKind,
    Destination,
    RetiredBroker,
    RetiredCluster,
    Subscription,
    utcnow,
)
from msgbus.registry import Registry
from msgbus.settings import ConnectionSettings
from msgbus.store import MongoStore
from msgbus.tasks import PeriodicWork

log = logging.getLogger(__name__)

TIMEOUT_S = 10.0

ALL_CLUSTERS = "*"
# what a retirement left behind, as the drains record it:
# (destination code, broker kind, cluster or ALL_CLUSTERS, retired_at ISO)
Source = tuple[str, str, str, str]
Retired = RetiredBroker | RetiredCluster
# what a worker consumes: a broker kind, on one cluster or (None) on every configured one
Consumed = tuple[BrokerKind, str | None]


def source_of(code: str, retired: Retired) -> Source:
    cluster = retired.cluster if isinstance(retired, RetiredCluster) else ALL_CLUSTERS
    return code, retired.broker.value, cluster, _aware(retired.retired_at).isoformat()


def consumed(retired: Retired) -> Consumed:
    return retired.broker, retired.cluster if isinstance(retired, RetiredCluster) else None


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def kafka_lag(bootstrap: str, group: str, topic: str) -> int:
    """Messages of `topic` the consumer group has not committed (0: no such topic)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "enable.auto.commit": False})
    try:
        found = consumer.list_topics(topic, timeout=TIMEOUT_S).topics.get(topic)
        if found is None or found.error is not None:
            return 0
        parts = [TopicPartition(topic, p) for p in found.partitions]
        lag = 0
        for committed in consumer.committed(parts, timeout=TIMEOUT_S):
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, committed.partition), timeout=TIMEOUT_S)
            lag += max(0, high - (committed.offset if committed.offset >= 0 else low))
        return lag
    finally:
        consumer.close()


def rabbit_queue_state(nodes: list[str], queue: str) -> tuple[int, int]:
    """(messages ready, consumers) of a queue; (0, 0) when it does not exist."""
    with short_lived_connection(nodes) as connection:
        try:
            declared = connection.channel().queue_declare(queue, passive=True)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code == 404:
                return 0, 0
            raise
        return declared.method.message_count, declared.method.consumer_count


class DrainWatch(PeriodicWork):
    def __init__(self, store: MongoStore, registry: Registry, connections: ConnectionSettings,
                 on_change: Callable[[], Awaitable[None]], *, settle_s: float,
                 interval_s: float) -> None:
        super().__init__()
        self._drains = store.drains
        self._config = store.config
        self._registry = registry
        self._connections = connections
        self._on_change = on_change
        self._settle = timedelta(seconds=max(settle_s, 3 * connections.config_refresh_s))
        self._drained: set[tuple[Source, str]] = set()  # (source, subscription name)
        self._let_go: set[tuple[Source, str]] = set()  # RabbitMQ queues seen with none ready
        self.every(interval_s, self.check, what="old broker drains",
                   ready=store.gate.wait_available)

    # -- what to consume (the supervisor asks) --------------------------------------------

    def sources_for(self, destination: Destination, sub: Subscription) -> list[Consumed]:
        """What the subscription's worker consumes now."""
        undrained = self.undrained(destination, sub)
        held = [r for r in undrained
                if (source_of(destination.code, r), sub.name) not in self._let_go]
        if sub.ordered_by_biz_id:
            if undrained:
                return [consumed(undrained[0])] if undrained[0] in held else []
            return [(destination.broker, self._active_cluster(destination.broker))]
        return [(destination.broker, None)] + [
            consumed(r) for r in held if r.broker is not destination.broker]

    def undrained(self, destination: Destination, sub: Subscription) -> list[Retired]:
        """What may still hold messages of `sub`, oldest first: the destination's retired
        brokers; for an ordered subscription also the retired clusters of its broker."""
        retired: list[Retired] = list(destination.retired)
        if sub.ordered_by_biz_id:
            retired += [r for r in self._registry.runtime().retired_clusters
                        if r.broker is destination.broker]
        return sorted((r for r in retired
                       if _aware(sub.created_at) < _aware(r.retired_at)
                       and (source_of(destination.code, r), sub.name) not in self._drained),
                      key=lambda r: _aware(r.retired_at))

    def _active_cluster(self, kind: BrokerKind) -> str | None:
        return self._registry.runtime().active_cluster(kind, list(self._connections.clusters(kind)))

    # -- the checks -----------------------------------------------------------------------

    async def load(self) -> None:
        """The drains recorded so far (also at start, before the first workers)."""
        self._drained = {((d["destination"], d["broker"], d.get("cluster", ALL_CLUSTERS),
                           d["retired_at"]), d["subscription"])
                         for d in await self._drains.recorded()}

    async def check(self) -> None:
        await self.load()
        await self._forget_gone_retirements()
        before = (set(self._drained), set(self._let_go))
        now = utcnow()
        for destination in self._registry.destinations():
            subs = [s for s in self._registry.subscriptions_of(destination.code)
                    if not s.paused]
            for sub in subs:
                for retired in self.undrained(destination, sub):
                    if _aware(retired.retired_at) + self._settle <= now:
                        await self._check_one(destination.code, retired, sub)
            for gone in destination.retired:
                if _aware(gone.retired_at) + self._settle <= now:
                    await self._retire_if_drained(destination, gone)
        if (self._drained, self._let_go) != before:
            await self._on_change()

    async def _forget_gone_retirements(self) -> None:
        """Drains of brokers no destination lists as retired any more (drained by every
        subscription, or the destination deleted) are of no use."""
        live = {source_of(d.code, r) for d in self._registry.destinations() for r in d.retired}
        live |= {source_of(d.code, r) for d in self._registry.destinations()
                 for r in self._registry.runtime().retired_clusters}
        settled = (utcnow() - self._settle).isoformat()  # what every registry knows by now
        gone = {key for key in self._drained if key[0] not in live and key[0][3] < settled}
        if gone:
            await self._drains.forget(["|".join((*source, name)) for source, name in gone])
            self._drained -= gone

    async def _check_one(self, code: str, retired: Retired, sub: Subscription) -> None:
        source = source_of(code, retired)
        key = (source, sub.name)
        kind, cluster = consumed(retired)
        clusters = [nodes for name, nodes in self._connections.clusters(kind).items()
                    if cluster in (None, name)]
        try:
            if kind is BrokerKind.KAFKA:
                empty = await asyncio.to_thread(self._kafka_empty, code, sub.name, clusters)
            else:
                states = await asyncio.to_thread(self._rabbit_states, code, sub.name, clusters)
                empty = self._rabbit_empty(key, states)
        except Exception as exc:  # unreachable now: the next check tries again
            log.info("%s/%s on the retired %s: not checked (%r)", code, sub.name,
                     retired.broker.value, exc)
            return
        if empty:
            await self._drains.record(
                "|".join((*source, sub.name)),
                {"destination": code, "broker": source[1], "cluster": source[2],
                 "retired_at": source[3], "subscription": sub.name, "drained_at": utcnow()})
            self._drained.add(key)
            self._let_go.discard(key)
            log.info("%s/%s drained the %s (cluster %s) it used before %s", code, sub.name,
                     kind.value, cluster or "all", source[3])

    @staticmethod
    def _kafka_empty(code: str, name: str, clusters: list[list[str]]) -> bool:
        return all(kafka_lag(",".join(nodes), consumer_name(code, name), topic_name(code)) == 0
                   for nodes in clusters)

    @staticmethod
    def _rabbit_states(code: str, name: str, clusters: list[list[str]]
                       ) -> list[tuple[int, int]]:
        return [rabbit_queue_state(nodes, consumer_name(code, name)) for nodes in clusters]

    def _rabbit_empty(self, key: tuple[Source, str], states: list[tuple[int, int]]) -> bool:
        if any(ready for ready, _ in states):
            self._let_go.discard(key)
            return False
        self._let_go.add(key)  # nothing ready: stop consuming, so the consumers can be counted
        return not any(consumers for _, consumers in states)

    async def _retire_if_drained(self, destination: Destination,
                                 retired: RetiredBroker) -> None:
        """Every subscription that existed then drained it (paused ones included): it goes."""
        subs = self._registry.subscriptions_of(destination.code)
        if any(retired in self.undrained(destination, s) for s in subs):
            return
        await self._config.drop_retired_broker(destination.code, retired)
        log.info("%s: the retired %s is drained by every subscription", destination.code,
                 retired.broker.value)
