"""`ReceiverService`: the receiver's parts, wired from its settings.

The receiver answers producers (`Intake`) and drains its buffer (`DrainService`) either in a
drain process of its own (`drainer="process"`, the default; receiver/drain_process.py) or on
its own event loop (`drainer="inline"`: `msgbus up`, in-process tests).
"""

from __future__ import annotations

import logging
import os
import socket

from pymongo.errors import PyMongoError

from msgbus.metrics import MULTIPROCESS_DIR_VARIABLE
from msgbus.registry import Registry
from msgbus.settings import ReceiverSettings
from msgbus.store import MongoStore
from msgbus.tasks import CloseStep, close_in_order
from receiver.beacon import Beacon
from receiver.bufferslots import claim_slot
from receiver.drain_process import DrainProcess
from receiver.draining import DrainService, open_buffer
from receiver.intake import Intake
from receiver.producers import ProducerAuthenticator

log = logging.getLogger(__name__)


class ReceiverService:
    def __init__(self, settings: ReceiverSettings) -> None:
        conn = settings.connections
        conn.require_internal_token()
        self.settings = settings
        self.store = MongoStore(conn.mongo_uri, conn.mongo_db, component="receiver")
        self.registry = Registry(self.store, refresh_s=conn.config_refresh_s,
                                 payload_schemas=True)
        self.auth = ProducerAuthenticator(self.store)
        # several receivers may share the buffer root: each owns one slot of it
        buffer_root = settings.buffer_dir or conn.state_dir / "receiver-buffer"
        self.slot = claim_slot(buffer_root)
        self.drain_process: DrainProcess | None = None
        self.drains: DrainService | None = None
        if settings.drainer == "process":
            self.drain_process = DrainProcess(settings, self.slot)
            self.buffer = open_buffer(settings, self.slot.path,
                                      on_commit=self.drain_process.ring)
        else:
            self.buffer = open_buffer(settings, self.slot.path)
            self.drains = DrainService(settings, self.store, self.registry, self.buffer,
                                       buffer_root)
        self.intake = Intake(self.buffer)
        self.beacon = Beacon(self.store, instance=f"{socket.gethostname()}-{os.getpid()}",
                             health_url=conn.health_url(settings.host, settings.port))

    async def start(self) -> None:
        """Starts even while MongoDB or a broker is down: what is buffered drains when they
        are back, and producers the receiver knows keep sending."""
        try:
            await self.store.ensure_indexes()
        except PyMongoError as exc:
            log.warning("MongoDB is unreachable (%s); indexes are created at the next start",
                        type(exc).__name__)
        await self.registry.start()
        if self.drain_process is not None:
            if not os.environ.get(MULTIPROCESS_DIR_VARIABLE):
                log.warning("%s is not set: /metrics shows this process only, not the drain "
                            "process (`msgbus receiver` sets it)", MULTIPROCESS_DIR_VARIABLE)
            await self.drain_process.start()
        if self.drains is not None:
            await self.drains.start()
        self.beacon.start()
        log.info("receiver ready (drainer: %s)", self.settings.drainer)

    async def close(self) -> None:
        steps: list[CloseStep] = [("beacon", self.beacon.close), ("app keys", self.auth.close)]
        if self.drain_process is not None:
            steps.append(("drain process", self.drain_process.close))
        if self.drains is not None:
            steps.append(("drains", self.drains.close))
        steps += [("registry", self.registry.close), ("MongoDB client", self.store.close)]
        await close_in_order("receiver", steps)
        self.buffer.close()
        self.slot.release()
