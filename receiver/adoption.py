"""`OrphanAdopter`: flushes the buffers that receivers left behind.

A receiver killed with -9 (or stopped while its buffer still held entries) leaves its buffer slot
unlocked under the shared buffer root (receiver/bufferslots.py). A live receiver looks for such
slots when it starts and then every `scan_s`; it locks one, opens it with `open_buffer` and
flushes it with a second ingest pipeline from `make_pipeline` (the same class as its own, on that
buffer) until every queue is empty, then removes the slot. The pipeline's sinks are idempotent,
so whatever the dead receiver had already published or recorded may safely go again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

from msgbus.localqueue import LocalQueue
from msgbus.tasks import PeriodicWork
from receiver.bufferslots import ClaimedSlot, claim_path, find_orphans, sweep_removed
from receiver.pipeline import IngestPipeline

log = logging.getLogger(__name__)

BufferOpener = Callable[[Path], LocalQueue]
PipelineFactory = Callable[[LocalQueue], IngestPipeline]


class OrphanAdopter(PeriodicWork):
    """Scans from `start()` until `close()`; a slot being flushed at close is released as it
    is, for the next adopter."""

    def __init__(
        self, root: Path, open_buffer: BufferOpener, make_pipeline: PipelineFactory, *,
        scan_s: float, min_idle_s: float, poll_s: float = 0.2, progress_every_s: float = 10.0,
    ) -> None:
        super().__init__()
        self.root = root
        self._open_buffer, self._make_pipeline = open_buffer, make_pipeline
        self._min_idle_s, self._poll_s = min_idle_s, poll_s
        self._progress_every_s = progress_every_s
        self.adopted = 0  # slots flushed and removed by this adopter
        self.every(scan_s, self._scan, what="adopt orphaned buffers")

    async def _scan(self) -> None:
        try:
            await self.scan_once()
        except Exception:  # a disk or LMDB error on one slot: try again at the next scan
            log.exception("scanning %s for orphaned buffers failed", self.root)

    async def scan_once(self) -> int:
        """Adopt every orphan found now, one after the other; returns how many were flushed."""
        sweep_removed(self.root)
        flushed = 0
        for slot in find_orphans(self.root, self._min_idle_s):
            claimed = claim_path(slot)
            if claimed is None:  # a starting receiver or another adopter took it meanwhile
                continue
            try:
                await self._flush(claimed)
            finally:
                claimed.release()  # no-op after remove()
            flushed += 1
        return flushed

    async def _flush(self, slot: ClaimedSlot) -> None:
        buffer = self._open_buffer(slot.path)
        try:
            pipeline = self._make_pipeline(buffer)
            waiting = {queue: depth for queue, depth in pipeline.depths().items() if depth}
            if waiting:
                log.warning("adopting the orphaned receiver buffer %s: entries to flush per "
                            "queue: %s", slot.path, waiting)
                await self._flush_with(pipeline, slot)
        finally:
            buffer.close()
        slot.remove()
        self.adopted += 1
        if waiting:
            log.warning("orphaned receiver buffer %s: flushed (%s) and removed", slot.path,
                        waiting)
        else:
            log.info("removed the empty orphaned receiver buffer %s", slot.path)

    async def _flush_with(self, pipeline: IngestPipeline, slot: ClaimedSlot) -> None:
        pipeline.start()
        try:
            next_note = time.monotonic() + self._progress_every_s
            while depths := {q: d for q, d in pipeline.depths().items() if d}:
                if time.monotonic() >= next_note:
                    log.info("flushing the orphaned buffer %s: %s left", slot.path, depths)
                    next_note += self._progress_every_s
                await asyncio.sleep(self._poll_s)
        finally:
            await pipeline.close()
