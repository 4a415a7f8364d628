"""`CompensatorService`: the compensator's parts, wired from its settings — the retry rounds
(one scan for due work across subscriptions, a drain per subscription found), the sweeper and
the replay runner."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket

from compensator.replays import ReplayRunner
from compensator.retrier import SubscriptionRetrier
from compensator.rounds import RetryRounds
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
                                index_skip_scans=conn.mongo_index_skip_scans,
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
        self.rounds = RetryRounds(self.claims, self.registry.subscriptions, self._retrier,
                                  interval_s=settings.scan_interval_s,
                                  ready=self.store.gate.wait_available)
        self._known: set[str] = set()
        self._lock = asyncio.Lock()
        self.registry.on_change(self.sync)

    def _retrier(self, sub_id: str, closing: asyncio.Event) -> SubscriptionRetrier:
        return SubscriptionRetrier(
            sub_id, functools.partial(self.registry.subscription, sub_id), self.claims,
            self.store, self.sender, self.settings, self.shares, closing,
            on_recorded=self.notifier.saw_outcomes)

    async def start(self) -> None:
        await self.store.ensure_indexes()
        await self.sender.start()
        await self.registry.start()
        self.notifier.start()
        self.shares.start()
        await self.sync()
        self.rounds.start()
        self.sweeper.start()
        self.replays.start()

    @property
    def subscription_ids(self) -> list[str]:
        return sorted(self._known)

    async def sync(self) -> None:
        """A deleted subscription's retrier and cap shares go."""
        async with self._lock:
            known = {sub.id for sub in self.registry.subscriptions()}
            for sub_id in self._known - known:
                self.rounds.forget(sub_id)
                self.shares.forget(sub_id)
            self._known = known

    async def close(self) -> None:
        await close_in_order("compensator", (
            ("replays", self.replays.close), ("sweeper", self.sweeper.close),
            ("registry", self.registry.close), ("retry rounds", self.rounds.close),
            ("cap shares", self.shares.close), ("notifier", self.notifier.close),
            ("sender", self.sender.close), ("MongoDB client", self.store.close)))
