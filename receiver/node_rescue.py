"""`NodeDrainer`: what `msgbus spool-drainer` (the Kubernetes DaemonSet) does on one node.

Under the node's root (`SpoolDrainerSettings.root`, a hostPath every pod of the node mounts):

    receiver-buffer/slot-N/   the receivers' buffer slots (their shared MSGBUS_RECEIVER_BUFFER_DIR)
    spool/<app>/<pod>/        client spools of producer pods (msgbus_client, spool_dir)

Every `scan_interval_s` it finds the queues no live process holds and nobody wrote for
`min_idle_s`, and drains them: a receiver buffer into the brokers and MongoDB (receiver/rescue.py),
a client spool to the receiver (msgbus_client.spooltools, the code of `msgbus spool orphans
--drain`), and then deletes them. "Held" is the kernel's word, not a guess: each queue's owner
holds an flock on its lock file (slot.lock / spool.lock) for as long as it lives (the kernel drops
it on exit, even on kill -9), and every pod of the node sees the same lock on the same hostPath.
A queue is drained only while the drainer itself holds that lock, so no owner can start on it
meanwhile; it is re-checked for writes after the lock is taken. The two kinds are scanned by two
loops, so a receiver buffer that waits for MongoDB does not hold up the client spools.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from msgbus_client.errors import MsgbusClientError, SpoolLockedError, SpoolNotIdleError
from msgbus_client.spooltools import SpoolReport, drain_spool, find_spools, inspect_spool

from msgbus.metrics import (
    DRAINER_LAST_SCAN,
    NODE_ORPHAN_OLDEST_AGE,
    NODE_ORPHAN_PENDING,
    NODE_QUEUES,
    ORPHANS_DRAINED,
)
from msgbus.settings import SpoolDrainerSettings
from msgbus.tasks import cancel_and_wait
from receiver import bufferslots
from receiver.rescue import BufferRescuer

log = logging.getLogger(__name__)

BUFFER_DIR = "receiver-buffer"
SPOOL_DIR = "spool"
RECEIVER_BUFFER, CLIENT_SPOOL = "receiver_buffer", "client_spool"
STATES = ("held", "idle", "orphaned")


@dataclass
class ScanReport:
    """What one scan of one kind found and did."""

    kind: str
    held: int = 0
    idle: int = 0
    orphaned: int = 0
    drained: int = 0
    left: int = 0  # drained in part: messages stay in it for the next scan
    failed: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.left or self.failed)


class NodeDrainer:
    def __init__(self, settings: SpoolDrainerSettings, rescuer: BufferRescuer) -> None:
        self.settings = settings
        self.rescuer = rescuer
        self.buffer_root = settings.root / BUFFER_DIR
        self.spool_root = settings.root / SPOOL_DIR
        self.last: dict[str, ScanReport] = {}
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        await self.rescuer.start()
        self._tasks = [
            asyncio.create_task(self._loop(self.scan_buffers), name="drain-receiver-buffers"),
            asyncio.create_task(self._loop(self.scan_spools), name="drain-client-spools"),
        ]

    async def close(self) -> None:
        """Stop scanning. A buffer being drained is released as it is (its entries stay for
        the next owner). A client spool being drained goes on in its thread until it is empty
        or `drain_timeout_s` ends (the process exits after it): keep that below the pod's
        termination grace period. Either way nothing is lost: entries leave a queue only once
        taken."""
        await cancel_and_wait(*self._tasks)
        await self.rescuer.close()

    async def scan_once(self) -> list[ScanReport]:
        return [await self.scan_buffers(), await self.scan_spools()]

    async def _loop(self, scan: Callable[[], Awaitable[ScanReport]]) -> None:
        while True:
            try:
                await scan()
            except asyncio.CancelledError:
                raise
            except Exception:  # a disk error: try again at the next scan
                log.exception("spool drainer: scan failed")
            await asyncio.sleep(self.settings.scan_interval_s)

    # --- receiver buffers ---------------------------------------------------------------------

    async def scan_buffers(self) -> ScanReport:
        report = ScanReport(RECEIVER_BUFFER)
        oldest_s = 0.0
        for slot in bufferslots.slots(self.buffer_root):
            if not (slot / bufferslots.LMDB_DATA_FILE).is_file():
                continue
            idle_s = bufferslots.idle_s(slot)
            if bufferslots.holder_of(slot) is not None:
                report.held += 1
            elif idle_s < self.settings.min_idle_s:
                report.idle += 1
            else:
                report.orphaned += 1
                oldest_s = max(oldest_s, idle_s)
        self._show(report, oldest_s, pending=None)
        if report.orphaned:
            try:  # claims each orphan (its lock) before opening it; skips one taken meanwhile
                report.drained = await self.rescuer.rescue(self.buffer_root)
            except Exception as exc:
                report.failed = 1
                report.errors.append(f"{self.buffer_root}: {exc}")
                log.exception("spool drainer: draining receiver buffers under %s failed",
                              self.buffer_root)
        ORPHANS_DRAINED.labels(RECEIVER_BUFFER, "drained").inc(report.drained)
        ORPHANS_DRAINED.labels(RECEIVER_BUFFER, "failed").inc(report.failed)
        return self._done(report)

    # --- client spools ------------------------------------------------------------------------

    async def scan_spools(self) -> ScanReport:
        report = ScanReport(CLIENT_SPOOL)
        orphans = await asyncio.to_thread(self._find_spool_orphans, report)
        oldest_s = max((r.last_write_age_s for r in orphans), default=0.0)
        self._show(report, oldest_s, pending=sum(r.pending for r in orphans))
        if orphans and not self.settings.receiver_url:
            report.failed = len(orphans)  # so that MsgbusOrphanDrainFailing tells someone
            report.errors.append("MSGBUS_SPOOL_DRAINER_RECEIVER_URL is not set: orphaned "
                                 "client spools are reported, not drained")
            log.error("spool drainer: %s", report.errors[-1])
        else:
            for orphan in orphans:
                await asyncio.to_thread(self._drain_spool, orphan, report)
        for outcome in ("drained", "left", "failed"):
            ORPHANS_DRAINED.labels(CLIENT_SPOOL, outcome).inc(getattr(report, outcome))
        return self._done(report)

    def _find_spool_orphans(self, report: ScanReport) -> list[SpoolReport]:
        if not self.spool_root.is_dir():
            return []
        orphans = []
        for path in find_spools(self.spool_root):
            try:
                found = inspect_spool(path)
            except MsgbusClientError as exc:
                report.errors.append(f"{path}: {exc}")
                log.warning("spool drainer: skipping %s: %s", path, exc)
                continue
            if found.held_by is not None:
                report.held += 1
            elif not found.orphaned(self.settings.min_idle_s):
                report.idle += 1
            else:
                report.orphaned += 1
                orphans.append(found)
        return orphans

    def _drain_spool(self, orphan: SpoolReport, report: ScanReport) -> None:
        try:
            drained = drain_spool(
                orphan.path, self.settings.receiver_url, self.api_key_for(orphan.path),
                min_idle_s=self.settings.min_idle_s, timeout_s=self.settings.drain_timeout_s)
        except (SpoolLockedError, SpoolNotIdleError) as exc:  # its owner came back meanwhile
            log.info("spool drainer: %s", exc)
            return
        except MsgbusClientError as exc:
            report.failed += 1
            report.errors.append(f"{orphan.path}: {exc}")
            log.error("spool drainer: draining %s failed: %s", orphan.path, exc)
            return
        if drained.removed:
            report.drained += 1
            log.warning("spool drainer: orphaned client spool %s: %d delivered, removed",
                        orphan.path, drained.delivered)
        else:
            report.left += 1
            log.error("spool drainer: orphaned client spool %s: %d delivered, %d pending and %d "
                      "rejected left in it", orphan.path, drained.delivered, drained.left,
                      drained.rejected)

    def api_key_for(self, spool: Path) -> str:
        """The key in <api_keys_dir>/<app> for a spool under spool/<app>/, else the default."""
        keys_dir = self.settings.api_keys_dir
        with contextlib.suppress(ValueError, IndexError):
            app = spool.relative_to(self.spool_root).parts[0]
            if keys_dir is not None and (keys_dir / app).is_file():
                return (keys_dir / app).read_text().strip()
        return self.settings.api_key.get_secret_value()

    # --- metrics ------------------------------------------------------------------------------

    @staticmethod
    def _show(report: ScanReport, oldest_s: float, pending: int | None) -> None:
        for state in STATES:
            NODE_QUEUES.labels(report.kind, state).set(getattr(report, state))
        NODE_ORPHAN_OLDEST_AGE.labels(report.kind).set(oldest_s)
        if pending is not None:
            NODE_ORPHAN_PENDING.labels(report.kind).set(pending)

    def _done(self, report: ScanReport) -> ScanReport:
        self.last[report.kind] = report
        DRAINER_LAST_SCAN.labels(report.kind).set(time.time())
        return report
