"""`CompensatorService`: for now a scan loop that logs how many deliveries wait for a retry.

Retries, sweeps, leases and replays arrive with the compensator issue; the loop and its
settings are the place they go.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from msgbus.models import DeliveryStatus, utcnow
from msgbus.settings import CompensatorSettings
from msgbus.store import MongoStore

log = logging.getLogger(__name__)


class CompensatorService:
    def __init__(self, settings: CompensatorSettings) -> None:
        self.settings = settings
        self.store = MongoStore(settings.connections.mongo_uri, settings.connections.mongo_db)
        self._task: asyncio.Task[None] | None = None
        self.last_due = 0

    async def start(self) -> None:
        await self.store.ensure_indexes()
        self._task = asyncio.create_task(self._scan_loop(), name="compensator-scan")

    async def close(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.store.close()

    async def _scan_loop(self) -> None:
        while True:
            try:
                due = await self.store.deliveries.count_documents(
                    {"status": DeliveryStatus.FAILED.value, "next_attempt_at": {"$lte": utcnow()}})
                if due != self.last_due:
                    log.info("compensator: %d failed deliveries are due for a retry "
                             "(retries are not implemented yet)", due)
                self.last_due = due
            except Exception as exc:
                log.warning("compensator scan failed: %s", exc)
            await asyncio.sleep(self.settings.scan_interval_s)
