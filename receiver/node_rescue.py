"""`NodeRescuer`: what `msgbus node-rescuer` (the Kubernetes DaemonSet) does on one node.

Under the node's root (`NodeRescuerSettings.root`, a hostPath every pod of the node mounts):

    receiver-buffer/slot-N/   the receivers' buffer slots (their shared MSGBUS_RECEIVER_BUFFER_DIR)
    spool/<app>/<pod>/        client spools of producer pods (msgbus_client, spool_dir)

Every `scan_interval_s` it finds the queues no live process holds and nobody wrote for
`min_idle_s`, and rescues them: a receiver buffer is flushed into the brokers and MongoDB
(receiver/rescue.py), a client spool sent to the receiver (msgbus_client.spooltools, the code of
`msgbus spool orphans --rescue`), and then they are deleted. "Held" is the kernel's word, not a
guess: each queue's owner holds an flock on its lock file (slot.lock / spool.lock) for as long as
it lives (the kernel drops it on exit, even on kill -9), and every pod of the node sees the same
lock on the same hostPath.
A queue is rescued only while the rescuer itself holds that lock, so no owner can start on it
meanwhile; it is re-checked for writes after the lock is taken. The two kinds are scanned by two
periodic jobs, so a receiver buffer that waits for MongoDB does not hold up the client spools.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from msgbus_client.errors import MsgbusClientError, SpoolLockedError, SpoolNotIdleError
from msgbus_client.spooltools import SpoolReport, find_spools, inspect_spool, rescue_spool

from msgbus.metrics import (
    NODE_ORPHAN_OLDEST_AGE,
    NODE_ORPHAN_PENDING,
    NODE_QUEUES,
    ORPHANS_RESCUED,
    RESCUER_LAST_SCAN,
)
from msgbus.settings import NodeRescuerSettings
from msgbus.tasks import PeriodicWork
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
    rescued: int = 0
    left: int = 0  # rescued in part: messages stay in it for the next scan
    failed: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.left or self.failed)


class NodeRescuer:
    def __init__(self, settings: NodeRescuerSettings, rescuer: BufferRescuer) -> None:
        self.settings = settings
        self.rescuer = rescuer
        self.buffer_root = settings.root / BUFFER_DIR
        self.spool_root = settings.root / SPOOL_DIR
        self.last: dict[str, ScanReport] = {}
        # a scan that fails (a disk error) is logged and tried again at the next one
        self._scans = PeriodicWork()
        self._scans.every(settings.scan_interval_s, self.scan_buffers,
                          what="receiver buffer rescue")
        self._scans.every(settings.scan_interval_s, self.scan_spools,
                          what="client spool rescue")

    async def start(self) -> None:
        await self.rescuer.start()
        self._scans.start()

    async def close(self) -> None:
        """Stop scanning. A buffer being rescued is released as it is (its entries stay for
        the next owner). A client spool being rescued goes on in its thread until it is empty
        or `rescue_timeout_s` ends (the process exits after it): keep that below the pod's
        termination grace period. Either way nothing is lost: entries leave a queue only once
        taken."""
        await self._scans.close()
        await self.rescuer.close()

    async def scan_once(self) -> list[ScanReport]:
        return [await self.scan_buffers(), await self.scan_spools()]

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
                report.rescued = await self.rescuer.rescue(self.buffer_root)
            except Exception as exc:
                report.failed = 1
                report.errors.append(f"{self.buffer_root}: {exc}")
                log.exception("node rescuer: rescuing receiver buffers under %s failed",
                              self.buffer_root)
        ORPHANS_RESCUED.labels(RECEIVER_BUFFER, "rescued").inc(report.rescued)
        ORPHANS_RESCUED.labels(RECEIVER_BUFFER, "failed").inc(report.failed)
        return self._done(report)

    # --- client spools ------------------------------------------------------------------------

    async def scan_spools(self) -> ScanReport:
        report = ScanReport(CLIENT_SPOOL)
        orphans = await asyncio.to_thread(self._find_spool_orphans, report)
        oldest_s = max((r.last_write_age_s for r in orphans), default=0.0)
        self._show(report, oldest_s, pending=sum(r.pending for r in orphans))
        if orphans and not self.settings.receiver_url:
            report.failed = len(orphans)  # so that MsgbusOrphanRescueFailing tells someone
            report.errors.append("MSGBUS_NODE_RESCUER_RECEIVER_URL is not set: orphaned "
                                 "client spools are reported, not rescued")
            log.error("node rescuer: %s", report.errors[-1])
        else:
            for orphan in orphans:
                await asyncio.to_thread(self._rescue_spool, orphan, report)
        for outcome in ("rescued", "left", "failed"):
            ORPHANS_RESCUED.labels(CLIENT_SPOOL, outcome).inc(getattr(report, outcome))
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
                log.warning("node rescuer: skipping %s: %s", path, exc)
                continue
            if found.held_by is not None:
                report.held += 1
            elif not found.orphaned(self.settings.min_idle_s):
                report.idle += 1
            else:
                report.orphaned += 1
                orphans.append(found)
        return orphans

    def _rescue_spool(self, orphan: SpoolReport, report: ScanReport) -> None:
        try:
            rescued = rescue_spool(
                orphan.path, self.settings.receiver_url, self.api_key_for(orphan.path),
                min_idle_s=self.settings.min_idle_s, timeout_s=self.settings.rescue_timeout_s)
        except (SpoolLockedError, SpoolNotIdleError) as exc:  # its owner came back meanwhile
            log.info("node rescuer: %s", exc)
            return
        except MsgbusClientError as exc:
            report.failed += 1
            report.errors.append(f"{orphan.path}: {exc}")
            log.error("node rescuer: rescuing %s failed: %s", orphan.path, exc)
            return
        if rescued.removed:
            report.rescued += 1
            log.warning("node rescuer: orphaned client spool %s: %d delivered, removed",
                        orphan.path, rescued.delivered)
        else:
            report.left += 1
            log.error("node rescuer: orphaned client spool %s: %d delivered, %d pending and %d "
                      "rejected left in it", orphan.path, rescued.delivered, rescued.left,
                      rescued.rejected)

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
        RESCUER_LAST_SCAN.labels(report.kind).set(time.time())
        return report
