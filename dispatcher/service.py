"""`DispatcherService`: the dispatcher's parts, wired from its settings."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket

from pymongo.errors import PyMongoError

from dispatcher.backlog import BacklogMonitor
from dispatcher.brokerhealth import BrokerHealthMonitor
from dispatcher.cleanup import BrokerCleanup
from dispatcher.drains import DrainWatch
from dispatcher.redelivery import REMEMBERED, DeliveredCheck
from dispatcher.supervisor import WorkerSupervisor
from dispatcher.trace import QUEUE as TRACE_QUEUE
from dispatcher.trace import TraceWriter
from msgbus.backoff import backoff_s
from msgbus.delivery.senders import make_sender
from msgbus.delivery.shares import CapShares
from msgbus.localqueue import LocalQueue
from msgbus.metrics import DELIVERY_OBJECTIVE, SUBSCRIPTION_INFO
from msgbus.models import BrokerKind, Subscription
from msgbus.notify import Notifier
from msgbus.registry import Registry
from msgbus.settings import DispatcherSettings, sealing_keys
from msgbus.store import MongoStore
from msgbus.store.deletions import DeletionStore
from msgbus.store.shares import ShareStore
from msgbus.tasks import CloseStep, cancel_and_wait, close_in_order
from msgbus.teams import PLATFORM_TEAM

log = logging.getLogger(__name__)

TRACE_BUFFER_MAX_BYTES = 1024**3
# At start, how long outcomes left on local disk by a killed run may take to reach MongoDB
# before the workers start anyway
LEFTOVER_TRACE_WAIT_S = 10.0


class DispatcherService:
    def __init__(self, settings: DispatcherSettings) -> None:
        conn = settings.connections
        conn.require_internal_token()
        self.settings = settings
        self.instance = settings.instance or f"{socket.gethostname()}-{os.getpid()}"
        self.keys = sealing_keys(conn)  # to open the sealed signing secrets
        self.store = MongoStore(conn.mongo_uri, conn.mongo_db, component="dispatcher",
                                index_skip_scans=conn.mongo_index_skip_scans,
                                keys=self.keys)
        self.registry = Registry(self.store, refresh_s=conn.config_refresh_s,
                                 snapshot=conn.state_dir / "dispatcher-config.json")
        trace_dir = settings.trace_dir or conn.state_dir / "dispatcher-trace"
        self.trace_buffer = LocalQueue(trace_dir, (TRACE_QUEUE,),
                                       max_bytes=TRACE_BUFFER_MAX_BYTES)
        self.trace = TraceWriter(self.trace_buffer, self.store,
                                 batch_size=settings.trace_batch_size)
        self.sender = make_sender(settings.http_client, instance=self.instance,
                                  push=settings.push, keys=self.keys)
        self.delivered = DeliveredCheck(self.store, after_s=settings.check_delivered_after_s)
        self.shares = CapShares(ShareStore(self.store), instance=self.instance,
                                component="dispatcher", heartbeat_s=conn.share_heartbeat_s,
                                lease_s=conn.share_lease_s,
                                health_url=conn.health_url(settings.host, settings.port))
        self.notifier = Notifier(self.store, self.sender, self.keys,
                                 component=self.shares.instance,
                                 ui_url=conn.ui_url, cooldown_s=conn.notify_cooldown_s)
        self.shares.on_circuit = self.notifier.circuit_changed
        self.trace.on_recorded = self.notifier.saw_outcomes
        self.drains = DrainWatch(self.store, self.registry, conn,
                                 on_change=lambda: self.supervisor.sync(),
                                 settle_s=settings.drain_settle_s,
                                 interval_s=settings.drain_check_interval_s)
        self.supervisor = WorkerSupervisor(settings, self.registry, self.sender, self.trace,
                                           self.delivered, self.shares, self.drains)
        self.cleanup = BrokerCleanup(DeletionStore(self.store), ShareStore(self.store), conn,
                                     interval_s=settings.cleanup_interval_s)
        self.backlog = BacklogMonitor(self.store, self.supervisor.paused_partitions,
                                      interval_s=settings.backlog_interval_s,
                                      late_after_s=self.late_after_s,
                                      on_late=self.notifier.delivery_late)
        self.broker_health: BrokerHealthMonitor | None = None
        self._indexes: asyncio.Task[None] | None = None
        if settings.broker_health_interval_s > 0:
            self.broker_health = BrokerHealthMonitor(
                conn, self.subscriptions_by_broker, interval_s=settings.broker_health_interval_s,
                mongo_ping=self.store.ping)

    async def show_subscription_info(self) -> None:
        """`msgbus_subscription_info`: each subscription's team, for the alerts' team label;
        `msgbus_subscription_late_after_seconds`: its delivery objective, for their threshold."""
        SUBSCRIPTION_INFO.clear()
        DELIVERY_OBJECTIVE.clear()
        for sub in self.registry.subscriptions():
            destination = self.registry.known_destination(sub.destination)
            team = sub.team or (destination.team if destination else PLATFORM_TEAM)
            SUBSCRIPTION_INFO.labels(sub.id, sub.destination, team).set(1)
            DELIVERY_OBJECTIVE.labels(sub.id).set(sub.late_after_s)

    def late_after_s(self, sub_id: str) -> float | None:
        sub = self.registry.subscription(sub_id)
        return None if sub is None else sub.late_after_s

    def subscriptions_by_broker(self) -> list[tuple[Subscription, BrokerKind]]:
        """Every subscription the registry knows, with its destination's current broker."""
        found = []
        for sub in self.registry.subscriptions():
            destination = self.registry.known_destination(sub.destination)
            if destination is not None:
                found.append((sub, destination.broker))
        return found

    async def start(self) -> None:
        """Starts also while MongoDB is down: from the configuration the last run saved, with
        outcomes waiting on local disk, and the indexes made once MongoDB answers."""
        self._indexes = asyncio.create_task(self._ensure_indexes(), name="ensure-indexes")
        await self.sender.start()
        await self._write_leftover_trace()
        self.trace.start()
        self.registry.on_change(self.show_subscription_info)
        await self.registry.start()
        self.notifier.start()
        self.shares.start()
        await self._load_drains()
        await self.supervisor.start()
        self.drains.start()
        self.backlog.start()
        self.cleanup.start()
        if self.broker_health is not None:
            self.broker_health.start()

    async def _load_drains(self) -> None:
        try:
            async with self.store.gate.guard("old broker drains", LEFTOVER_TRACE_WAIT_S):
                await self.drains.load()
        except Exception as exc:  # MongoDB down: every retired broker is consumed meanwhile
            log.warning("the old brokers' drains are not known yet (%r)", exc)

    async def _ensure_indexes(self) -> None:
        failures = 0
        while True:
            try:
                await self.store.ensure_indexes()
                return
            except PyMongoError as exc:
                failures += 1
                delay = backoff_s(failures=failures, first_s=1.0, max_s=30.0)
                log.warning("MongoDB indexes not ensured (%s); retrying in %.0f s",
                            type(exc).__name__, delay)
                await asyncio.sleep(delay)

    async def _write_leftover_trace(self) -> None:
        """A run killed with -9 leaves the outcomes it had not yet written to MongoDB on local
        disk, and the brokers hand its unacked messages out again. `DeliveredCheck` learns
        the delivered ones from there, and they are written first (bounded), so that MongoDB
        shows them too."""
        left = self.trace.backlog()
        if not left:
            return
        self.delivered.remember((o.result.subscription, o.result.message_id)
                                for o in self.trace.waiting(REMEMBERED) if o.result.ok)
        if not await self.store.ping():
            return  # MongoDB down: the trace's flusher writes them once it is back
        log.info("writing %d outcomes left by the previous run before starting the workers",
                 left)
        try:
            await asyncio.wait_for(self.trace.flush(), LEFTOVER_TRACE_WAIT_S)
        except Exception as exc:  # MongoDB slow or down: the flusher goes on with the rest
            log.warning("the previous run's outcomes are not all written (%r); starting the "
                        "workers anyway", exc)

    async def close(self) -> None:
        await cancel_and_wait(self._indexes)
        steps: list[CloseStep] = []
        if self.broker_health is not None:
            steps.append(("broker health", self.broker_health.close))
        steps += [("broker cleanup", self.cleanup.close), ("drain watch", self.drains.close),
                  ("backlog gauges", self.backlog.close), ("registry", self.registry.close),
                  ("workers", self.supervisor.close), ("cap shares", self.shares.close),
                  ("notifier", self.notifier.close),
                  ("trace writer", self.trace.close),
                  ("trace flush", self._flush_trace), ("sender", self.sender.close),
                  ("MongoDB client", self.store.close)]
        await close_in_order("dispatcher", steps)
        self.trace_buffer.close()

    async def _flush_trace(self) -> None:
        # MongoDB down: the outcomes stay in the local buffer for the next start.
        with contextlib.suppress(Exception):
            await self.trace.flush()
