"""`CompensatorService`: the compensator's parts, wired from its settings — a retry loop per
subscription, the sweeper and the replay runner."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket

from compensator.replays import ReplayRunner
from compensator.retrier import SubscriptionRetrier
from compensator.sweeper import Sweeper
from msgbus.delivery.senders import make_sender
from msgbus.delivery.shares import CapShares
from msgbus.notify import Notifier
from msgbus.registry import Registry
from msgbus.settings import CompensatorSettings, sealing_keys
from msgbus.store import MongoStore
from msgbus.store.claims import DeliveryClaims
from msgbus.store.pending import PendingSweep
from msgbus.store.shares import ShareStore
from msgbus.tasks import close_in_order

log = logging.getLogger(__name__)


class CompensatorService:
    def __init__(self, settings: CompensatorSettings) -> None:
        conn = settings.connections
        self.settings = settings
        self.instance = settings.instance or f"{socket.gethostname()}-{os.getpid()}"
        self.keys = sealing_keys(conn)  # to open the sealed signing secrets
        self.store = MongoStore(conn.mongo_uri, conn.mongo_db, component="compensator",
                                keys=self.keys)
        self.registry = Registry(self.store, refresh_s=conn.config_refresh_s)
        self.claims = DeliveryClaims(self.store, self.instance)
        self.sender = make_sender(settings.http_client, instance=self.instance,
                                  push=settings.push, keys=self.keys)
        self.sweeper = Sweeper(self.claims, PendingSweep(self.store), self.registry.subscriptions,
                               settings, ready=self.store.gate.wait_available)
        self.shares = CapShares(ShareStore(self.store), instance=self.instance,
                                component="compensator", heartbeat_s=conn.share_heartbeat_s,
                                lease_s=conn.share_lease_s,
                                health_url=conn.health_url(settings.host, settings.port))
        self.notifier = Notifier(self.store, self.sender, self.keys,
                                 component=self.shares.instance,
                                 ui_url=conn.ui_url, cooldown_s=conn.notify_cooldown_s)
        self.shares.on_circuit = self.notifier.circuit_changed
        self.replays = ReplayRunner(self.store, self.registry, self.sender, settings,
                                    self.shares, owner=self.instance)
        self.retriers: dict[str, SubscriptionRetrier] = {}
        self._lock = asyncio.Lock()
        self.registry.on_change(self.sync)

    async def start(self) -> None:
        await self.store.ensure_indexes()
        await self.sender.start()
        await self.registry.start()
        self.notifier.start()
        self.shares.start()
        await self.sync()
        self.sweeper.start()
        self.replays.start()

    async def sync(self) -> None:
        """One retry loop per configured subscription (a paused one idles in its loop)."""
        async with self._lock:
            wanted = {sub.id for sub in self.registry.subscriptions()}
            for sub_id in set(self.retriers) - wanted:
                await self.retriers.pop(sub_id).close()
                self.shares.forget(sub_id)
            for sub_id in wanted - set(self.retriers):
                retrier = SubscriptionRetrier(
                    sub_id, functools.partial(self.registry.subscription, sub_id),
                    self.claims, self.store, self.sender, self.settings, self.shares,
                    on_recorded=self.notifier.saw_outcomes)
                retrier.start()
                self.retriers[sub_id] = retrier

    async def close(self) -> None:
        await close_in_order("compensator", (
            ("replays", self.replays.close), ("sweeper", self.sweeper.close),
            ("registry", self.registry.close), ("retry loops", self._close_retriers),
            ("cap shares", self.shares.close), ("notifier", self.notifier.close),
            ("sender", self.sender.close), ("MongoDB client", self.store.close)))

    async def _close_retriers(self) -> None:
        async with self._lock:
            await asyncio.gather(*(r.close() for r in self.retriers.values()))
            self.retriers.clear()
