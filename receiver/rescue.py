"""`BufferRescuer`: rescues receiver buffers left on a node where no receiver runs any more.

A live receiver adopts the orphaned slots under its own buffer root (receiver/adoption.py). When
the receivers of a node moved away, nobody is left to do that: the node rescuer
(`msgbus node-rescuer`, the Kubernetes DaemonSet) runs a buffer rescuer instead. It is the
adoption code with publishers, a registry and a MongoDB store of its own and no buffer of its
own: each orphan (no live process holds its slot lock, untouched for `min_idle_s`) is locked,
flushed into the brokers and MongoDB, and removed. A slot a live process holds is never opened.
"""

from __future__ import annotations

import logging
from pathlib import Path

from msgbus.localqueue import LocalQueue
from msgbus.registry import Registry
from msgbus.settings import ReceiverSettings
from msgbus.store import MongoStore
from receiver.adoption import OrphanAdopter
from receiver.flushing import make_pipeline, open_buffer
from receiver.pipeline import IngestPipeline
from receiver.publishers import PublisherSet, build_publishers

log = logging.getLogger(__name__)


class BufferRescuer:
    def __init__(self, settings: ReceiverSettings, min_idle_s: float) -> None:
        conn = settings.connections
        self.settings = settings
        self.min_idle_s = min_idle_s
        self.store = MongoStore(conn.mongo_uri, conn.mongo_db, component="node-rescuer")
        self.registry = Registry(self.store, refresh_s=conn.config_refresh_s)
        self.publishers = PublisherSet(build_publishers(settings))
        self._started = False

    async def start(self) -> None:
        """Starts even while MongoDB or a broker is down; a rescue then waits for them."""
        await self.publishers.start()
        await self.registry.start()
        self._started = True

    async def close(self) -> None:
        if self._started:
            await self.registry.close()
            await self.publishers.close()
        await self.store.close()

    async def rescue(self, root: Path) -> int:
        """Flush and remove every orphaned buffer slot under `root` now; returns how many."""
        adopter = OrphanAdopter(root, self._open, self._pipeline_on, scan_s=0,
                                min_idle_s=self.min_idle_s)
        return await adopter.scan_once()

    def _open(self, path: Path) -> LocalQueue:
        return open_buffer(self.settings, path)

    def _pipeline_on(self, buffer: LocalQueue) -> IngestPipeline:
        return make_pipeline(self.settings, self.store, self.registry, self.publishers, buffer)
