"""`WorkerSupervisor`: keeps one running `SubscriptionWorker` per active subscription in step
with the registry. A subscription that is added, paused, resumed or changed (URL, concurrency,
broker of its destination) has its worker started, stopped or replaced within seconds."""

from __future__ import annotations

import asyncio
import logging

from dispatcher.worker import SubscriptionWorker, is_for
from msgbus.brokers.base import SubscriptionConsumer
from msgbus.delivery.sender import HttpSender
from msgbus.delivery.trace import TraceWriter
from msgbus.models import BrokerKind, Destination, Envelope, Subscription
from msgbus.registry import Registry
from msgbus.settings import DispatcherSettings

log = logging.getLogger(__name__)


def make_consumer(settings: DispatcherSettings, destination: Destination,
                  subscription: Subscription) -> SubscriptionConsumer | None:
    """The broker consumer of a subscription; None for direct (or an unconfigured broker)."""
    conn = settings.connections
    max_buffered = max(64, 4 * subscription.max_concurrency)
    if destination.broker is BrokerKind.KAFKA and conn.kafka_bootstrap:
        from msgbus.brokers.kafka import KafkaSubscriptionConsumer

        return KafkaSubscriptionConsumer(subscription, bootstrap=conn.kafka_bootstrap,
                                         max_buffered=max_buffered)
    if destination.broker is BrokerKind.RABBITMQ and conn.rabbitmq_url:
        from msgbus.brokers.rabbitmq import RabbitSubscriptionConsumer

        return RabbitSubscriptionConsumer(subscription, url=conn.rabbitmq_url,
                                          max_buffered=max_buffered)
    return None


class WorkerSupervisor:
    def __init__(self, settings: DispatcherSettings, registry: Registry, sender: HttpSender,
                 trace: TraceWriter) -> None:
        self._settings = settings
        self._registry = registry
        self._sender = sender
        self._trace = trace
        self._workers: dict[str, tuple[tuple[object, ...], SubscriptionWorker]] = {}
        self._lock = asyncio.Lock()
        registry.on_change(self.sync)

    def _wanted(self) -> dict[str, tuple[Subscription, Destination]]:
        wanted = {}
        for destination in self._registry.destinations():
            for sub in self._registry.subscriptions_of(destination.code):
                if not sub.paused:
                    wanted[sub.id] = (sub, destination)
        return wanted

    async def sync(self) -> None:
        async with self._lock:
            wanted = self._wanted()
            for sub_id in list(self._workers):
                version, _ = self._workers[sub_id]
                target = wanted.get(sub_id)
                if target is None or _version(*target) != version:
                    await self._stop(sub_id)
            for sub_id, (sub, destination) in wanted.items():
                if sub_id not in self._workers:
                    await self._start(sub, destination)

    async def _start(self, sub: Subscription, destination: Destination) -> None:
        consumer = make_consumer(self._settings, destination, sub)
        worker = SubscriptionWorker(sub, consumer, self._sender, self._trace,
                                    direct_queue_size=self._settings.direct_queue_size)
        try:
            await worker.start()
        except Exception:
            log.exception("starting the worker of %s failed; retrying at the next refresh",
                          sub.id)
            await worker.close(grace_s=0)
            return
        self._workers[sub.id] = (_version(sub, destination), worker)
        log.info("worker for %s started (%s)", sub.id, destination.broker.value)

    async def _stop(self, sub_id: str) -> None:
        _, worker = self._workers.pop(sub_id)
        await worker.close()
        log.info("worker for %s stopped", sub_id)

    def offer_direct(self, envelope: Envelope) -> bool:
        """Hand a message to every active subscription of its destination."""
        ok = True
        for sub in self._registry.subscriptions_of(envelope.destination):
            entry = self._workers.get(sub.id)
            if entry is not None and is_for(sub, envelope):
                ok = entry[1].offer_direct(envelope) and ok
        return ok

    def subscription_ids(self) -> list[str]:
        return sorted(self._workers)

    async def close(self) -> None:
        async with self._lock:
            await asyncio.gather(*(self._stop(s) for s in list(self._workers)))


def _version(sub: Subscription, destination: Destination) -> tuple[object, ...]:
    """What, when changed, needs a new worker."""
    return (sub.model_dump_json(), destination.broker)
