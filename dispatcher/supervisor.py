"""`WorkerSupervisor`: keeps one running `SubscriptionWorker` per active subscription in step
with the registry. A subscription that is added, paused, resumed or changed (URL, concurrency,
broker of its destination) has its worker started, stopped or replaced within seconds.

A worker consumes from every configured cluster of its destination's broker kind (receivers
publish to the active one, which the admin API switches), and after a switch of broker kind
also from each retired kind until it has drained it (`dispatcher.drains`): messages already in
a broker that is no longer used are still delivered."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from dispatcher.drains import Consumed, DrainWatch
from dispatcher.redelivery import DeliveredCheck
from dispatcher.trace import TraceWriter
from dispatcher.worker import SubscriptionWorker
from msgbus.assignment import leavers_holding, serves
from msgbus.brokers.base import SubscriptionConsumer
from msgbus.delivery.filters import subscription_receives
from msgbus.delivery.sender import Sender
from msgbus.delivery.shares import CapShares
from msgbus.metrics import ASSIGNMENT_MOVES
from msgbus.models import BrokerKind, Envelope, Subscription
from msgbus.registry import Registry
from msgbus.settings import DispatcherSettings
from msgbus.tasks import PeriodicWork

log = logging.getLogger(__name__)

RESYNC_S = 5.0  # also catches drain windows that ended
# at start, for the heartbeats' view of the other dispatchers (two beats on a slow MongoDB)
PEERS_WAIT_S = 10.0
# the longest a subscription that moves here waits for the instance it leaves to let it go
HANDOVER_MAX_S = 60.0


def make_consumers(settings: DispatcherSettings, sources: list[Consumed],
                   subscription: Subscription) -> list[SubscriptionConsumer]:
    """A subscription's consumers: one per cluster of each broker kind it reads (every
    configured cluster of the kind, or the one named; none for direct or an unconfigured
    broker). Each knows its `source`."""
    conn = settings.connections
    max_buffered = subscription.in_flight_budget
    consumers: list[SubscriptionConsumer] = []
    for kind, only in sources:
        for name, nodes in conn.clusters(kind).items():
            if only not in (None, name):
                continue
            consumer: SubscriptionConsumer
            if kind is BrokerKind.KAFKA:
                from msgbus.brokers.kafka import KafkaSubscriptionConsumer

                consumer = KafkaSubscriptionConsumer(
                    subscription, bootstrap=",".join(nodes), max_buffered=max_buffered,
                    extra_config={"fetch.wait.max.ms": settings.kafka_fetch_wait_ms})
            elif kind is BrokerKind.RABBITMQ:
                from msgbus.brokers.rabbitmq import RabbitSubscriptionConsumer

                consumer = RabbitSubscriptionConsumer(
                    subscription, url=nodes, max_buffered=max_buffered,
                    queue_type=conn.rabbitmq_queue_type)
            else:
                continue
            consumer.source = (kind, only)
            consumers.append(consumer)
    return consumers


class WorkerSupervisor:
    def __init__(self, settings: DispatcherSettings, registry: Registry, sender: Sender,
                 trace: TraceWriter, delivered: DeliveredCheck, shares: CapShares,
                 drains: DrainWatch) -> None:
        self._settings, self._registry, self._drains = settings, registry, drains
        self._assigned: set[str] = set()  # the brokered subscriptions this instance serves
        self._active: set[str] = set()  # every subscription not paused, at the last sync
        self._handover_since: dict[str, float] = {}  # moving here, the old instance holds it
        self._started = False
        # what each worker is built with
        self._sender, self._trace, self._delivered = sender, trace, delivered
        self._shares = shares
        # by subscription id: its version (what needs a new worker), the kinds it consumes
        self._workers: dict[str, tuple[str, list[Consumed], SubscriptionWorker]] = {}
        self._lock = asyncio.Lock()
        self._resync = PeriodicWork()
        self._resync_now = asyncio.Event()
        self._resync.every(RESYNC_S, self._sync_again, what="supervisor resync",
                           first_pause=True, wake=self._resync_now)
        registry.on_change(self.sync)
        shares.on_peers = self._resync_now.set  # a dispatcher came or went: the assignment moves

    async def start(self) -> None:
        # who else serves (the second heartbeat's read), so as not to start every consumer and
        # stop most of them a second later: a member that joins a Kafka group and leaves it
        # during the rebalance can stall the group (docs/decisions.md). MongoDB down: serve
        # everything meanwhile
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._shares.peers_known.wait(), PEERS_WAIT_S)
        self._started = True
        await self.sync()
        self._resync.start()

    async def _sync_again(self) -> None:
        try:
            await self.sync()
        except Exception:
            log.exception("re-syncing the workers failed")

    def _wanted(self) -> dict[str, tuple[Subscription, list[Consumed]]]:
        """The subscriptions to serve here: every active one assigned to this instance (a
        direct destination's: everywhere, it has no consumers to place)."""
        wanted, assigned, active = {}, set(), set()
        peers = self._shares.peers
        for destination in self._registry.destinations():
            for sub in self._registry.subscriptions_of(destination.code):
                if sub.paused:
                    continue
                sources = self._drains.sources_for(destination, sub)
                brokered = any(kind is not BrokerKind.DIRECT for kind, _ in sources)
                active.add(sub.id)
                if brokered and not serves(self._shares.instance, sub.id, peers,
                                           sub.dispatchers):
                    continue
                if brokered:
                    assigned.add(sub.id)
                    if self._awaits_handover(sub):
                        continue
                wanted[sub.id] = (sub, sources)
        self._count_moves(assigned, active)
        for sub_id in set(self._handover_since) - assigned:
            del self._handover_since[sub_id]
        return wanted

    def _awaits_handover(self, sub: Subscription) -> bool:
        """Whether a subscription that moves here waits for the instances that no longer
        serve it to let it go (their heartbeats stop listing it). A Kafka group that one
        member leaves while another joins has stalled for minutes (docs/decisions.md); one
        after the other, each rebalance takes seconds, and the cap is never split over both."""
        if sub.id in self._workers:
            return False
        leavers = leavers_holding(sub.id, self._shares.hosted, self._shares.peers,
                                  sub.dispatchers)
        if not leavers:
            self._handover_since.pop(sub.id, None)
            return False
        since = self._handover_since.setdefault(sub.id, time.monotonic())
        if time.monotonic() - since < HANDOVER_MAX_S:
            return True
        log.warning("%s moved here, but %s still serve it after %.0f s: serving it anyway",
                    sub.id, ", ".join(leavers), HANDOVER_MAX_S)
        return False

    def _count_moves(self, assigned: set[str], active: set[str]) -> None:
        """Subscriptions that came here or left because the instances changed (not because
        they were made, deleted, paused or resumed)."""
        ASSIGNMENT_MOVES.labels("in").inc(len((assigned - self._assigned) & self._active))
        ASSIGNMENT_MOVES.labels("out").inc(len((self._assigned - assigned) & active))
        self._assigned, self._active = assigned, active

    async def sync(self) -> None:
        if not self._started:  # the registry's first load: the assignment is not known yet
            return
        async with self._lock:
            wanted = self._wanted()
            for sub_id in list(self._workers):
                version, sources, _ = self._workers[sub_id]
                target = wanted.get(sub_id)
                if target is None or _version(target[0]) != version:
                    await self._stop(sub_id)
                elif target[1] != sources:
                    await self._reconsume(sub_id, target[0], target[1])
            for sub_id, (sub, sources) in wanted.items():
                if sub_id not in self._workers:
                    await self._start(sub, sources)
            for sub_id in self._shares.subscription_ids() - set(self._workers):
                self._shares.forget(sub_id)  # paused or gone: its share goes to the others

    async def _start(self, sub: Subscription, sources: list[Consumed]) -> None:
        consumers = make_consumers(self._settings, sources, sub)
        worker = SubscriptionWorker(sub, consumers, self._sender, self._trace, self._delivered,
                                    limiter=self._shares.limiter(sub),
                                    direct_queue_size=self._settings.direct_queue_size)
        try:
            await worker.start()
        except Exception:
            log.exception("starting the worker of %s failed; retrying at the next refresh",
                          sub.id)
            await worker.close(grace_s=0)
            return
        self._workers[sub.id] = (_version(sub), sources, worker)
        log.info("worker for %s started (%s)", sub.id, _describe(sources))

    async def _reconsume(self, sub_id: str, sub: Subscription, sources: list[Consumed]) -> None:
        """A broker or cluster to drain came or went: its consumers only, the others go on."""
        version, before, worker = self._workers[sub_id]
        worker.add_consumers(make_consumers(self._settings,
                                            [s for s in sources if s not in before], sub))
        await worker.retire_consumers([c for c in worker.consumers
                                       if c.source not in sources])
        self._workers[sub_id] = (version, sources, worker)
        log.info("worker for %s now consumes %s", sub_id,
                 _describe(sources) or "nothing (waiting for a drain)")

    async def _stop(self, sub_id: str) -> None:
        _, _, worker = self._workers.pop(sub_id)
        await worker.close()
        log.info("worker for %s stopped", sub_id)

    def offer_direct(self, envelope: Envelope) -> bool:
        """Hand a message to every active subscription of its destination."""
        ok = True
        for sub in self._registry.subscriptions_of(envelope.destination):
            entry = self._workers.get(sub.id)
            if entry is not None and subscription_receives(sub, envelope):
                ok = entry[2].offer_direct(envelope) and ok
        return ok

    def subscription_ids(self) -> list[str]:
        return sorted(self._workers)

    def worker(self, sub_id: str) -> SubscriptionWorker | None:
        entry = self._workers.get(sub_id)
        return entry[2] if entry is not None else None

    def paused_partitions(self) -> dict[str, int]:
        """Per subscription served here, the Kafka partitions its consumers paused."""
        return {sub_id: entry[2].paused_partitions for sub_id, entry in self._workers.items()}

    async def close(self) -> None:
        await self._resync.close()
        async with self._lock:
            await asyncio.gather(*(self._stop(s) for s in list(self._workers)))


def _describe(sources: list[Consumed]) -> str:
    return ", ".join(kind.value + (f" ({cluster})" if cluster else "")
                     for kind, cluster in sources)


def _version(sub: Subscription) -> str:
    """What, when changed, needs a new worker."""
    return sub.model_dump_json()
