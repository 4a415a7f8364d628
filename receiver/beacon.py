"""`Beacon`: a receiver's heartbeat in `instances` (msgbus/store/shares.py), so that the admin
knows where to read its /health (its Services panel: which processes see MongoDB).

Dispatchers, compensators and the admin heartbeat through their cap shares; a receiver pushes
nothing, so this writes only the lease and `health_url` (no `subscriptions`, no `circuits`:
the cap shares, the circuits and the broker clean-up read neither from a receiver's document).
"""

from __future__ import annotations

import contextlib

from pymongo.errors import PyMongoError

from msgbus.errors import MongoUnavailable
from msgbus.store import MongoStore
from msgbus.store.shares import ShareStore
from msgbus.tasks import PeriodicWork

COMPONENT = "receiver"
BEACON_S = 5.0
LEASE_BEATS = 3  # a lease outlives two missed beats
BEAT_TIMEOUT_S = 2.0


class Beacon(PeriodicWork):
    def __init__(self, store: MongoStore, *, instance: str, health_url: str | None,
                 interval_s: float = BEACON_S) -> None:
        super().__init__()
        self._shares = ShareStore(store)
        self._gate = store.gate
        self.instance = f"{COMPONENT}:{instance}"
        self.health_url = health_url
        self._lease_s = LEASE_BEATS * interval_s
        self.every(interval_s, self.beat, what="receiver beacon",
                   ready=store.gate.wait_available)

    async def beat(self) -> None:
        async with self._gate.guard("receiver beacon", BEAT_TIMEOUT_S):
            await self._shares.beat(self.instance, COMPONENT, self._lease_s,
                                    {"health_url": self.health_url})

    async def close(self) -> None:
        """Stops beating and leaves `instances` (a clean stop is no process to look for)."""
        await super().close()
        with contextlib.suppress(MongoUnavailable, PyMongoError):
            async with self._gate.guard("receiver beacon", BEAT_TIMEOUT_S):
                await self._shares.leave(self.instance)
