"""`ReceiverService`: the receiver's parts, wired from its settings.

The receiver answers producers (`Intake`) and flushes its buffer (`FlushService`) either in a
flush process of its own (`flusher="process"`, the default; receiver/flush_process.py) or on
its own event loop (`flusher="inline"`: `msgbus up`, in-process tests).
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
from receiver.flush_process import FlushProcess
from receiver.flushing import FlushService, open_buffer
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
        self.auth = ProducerAuthenticator(self.store.producers)
        # several receivers may share the buffer root: each owns one slot of it
        buffer_root = settings.buffer_dir or conn.state_dir / "receiver-buffer"
        self.slot = claim_slot(buffer_root)
        self.flush_process: FlushProcess | None = None
        self.flush_service: FlushService | None = None
        if settings.flusher == "process":
            self.flush_process = FlushProcess(settings, self.slot)
            self.buffer = open_buffer(settings, self.slot.path,
                                      on_commit=self.flush_process.ring)
        else:
            self.buffer = open_buffer(settings, self.slot.path)
            self.flush_service = FlushService(settings, self.store, self.registry, self.buffer,
                                              buffer_root)
        self.intake = Intake(self.buffer)
        self.beacon = Beacon(self.store, instance=f"{socket.gethostname()}-{os.getpid()}",
                             health_url=conn.health_url(settings.host, settings.port))

    async def start(self) -> None:
        """Starts even while MongoDB or a broker is down: what is buffered is flushed when
        they are back, and producers the receiver knows keep sending."""
        try:
            await self.store.ensure_indexes()
        except PyMongoError as exc:
            log.warning("MongoDB is unreachable (%s); indexes are created at the next start",
                        type(exc).__name__)
        await self.registry.start()
        if self.flush_process is not None:
            if not os.environ.get(MULTIPROCESS_DIR_VARIABLE):
                log.warning("%s is not set: /metrics shows this process only, not the flush "
                            "process (`msgbus receiver` sets it)", MULTIPROCESS_DIR_VARIABLE)
            await self.flush_process.start()
        if self.flush_service is not None:
            await self.flush_service.start()
        self.beacon.start()
        log.info("receiver ready (flusher: %s)", self.settings.flusher)

    async def close(self) -> None:
        steps: list[CloseStep] = [("beacon", self.beacon.close), ("app keys", self.auth.close)]
        if self.flush_process is not None:
            steps.append(("flush process", self.flush_process.close))
        if self.flush_service is not None:
            steps.append(("flush", self.flush_service.close))
        steps += [("registry", self.registry.close), ("MongoDB client", self.store.close)]
        await close_in_order("receiver", steps)
        self.buffer.close()
        self.slot.release()
