"""`Intake`: the receiver's durability point, and what its buffer holds.

`accept()` writes each message to two queues of the local LMDB buffer in one fsync'd
transaction: "publish" (to the destination's broker) and "record" (to MongoDB), both partitioned
by destination. Flushing them is the ingest pipeline's job (receiver/pipeline.py), in this
process or in a flush process of its own (receiver/flush_process.py).
"""

from __future__ import annotations

import contextlib
import uuid
from collections import defaultdict

from msgbus.codec import decode, encode
from msgbus.localqueue import Item, LocalQueue
from msgbus.metrics import (
    BUFFER_DEPTH,
    BUFFER_OLDEST_AGE,
    MESSAGES_ACCEPTED,
    MESSAGES_DUPLICATE,
)
from msgbus.models import Envelope, utcnow

PUBLISH_QUEUE = "publish"
RECORD_QUEUE = "record"
QUEUES = (PUBLISH_QUEUE, RECORD_QUEUE)


def _uuid_bytes(message_id: str) -> bytes:
    """`uuid.UUID(message_id).bytes`, without its cost for the canonical form."""
    if len(message_id) == 36 and message_id[8] == message_id[13] == message_id[18] \
            == message_id[23] == "-":
        with contextlib.suppress(ValueError):
            raw = bytes.fromhex(message_id.replace("-", ""))
            if len(raw) == 16:  # fromhex() skips whitespace: then take the general path
                return raw
    return uuid.UUID(message_id).bytes


class Intake:
    def __init__(self, buffer: LocalQueue) -> None:
        self.buffer = buffer

    async def accept(self, envelopes: list[Envelope]) -> list[bool]:
        """Buffer the messages durably; per message, False when this receiver accepted the
        same message_id within its dedupe window (a client re-send): it is not queued again."""
        items: list[Item] = []
        for envelope in envelopes:
            data = encode(envelope)
            destination = envelope.destination
            items.append((_uuid_bytes(envelope.message_id),
                          [((PUBLISH_QUEUE, destination), data),
                           ((RECORD_QUEUE, destination), data)]))
        fresh = await self.buffer.append_new(items)
        counts: dict[tuple[str, bool], int] = defaultdict(int)
        for envelope, is_new in zip(envelopes, fresh, strict=True):
            counts[envelope.destination, is_new] += 1
        for (destination, is_new), count in counts.items():
            counter = MESSAGES_ACCEPTED if is_new else MESSAGES_DUPLICATE
            counter.labels(destination).inc(count)
        return fresh

    def depths(self) -> dict[str, int]:
        """Entries waiting per queue; also refreshes the buffer gauges."""
        depths = queue_depths(self.buffer)
        for queue, depth in depths.items():
            BUFFER_DEPTH.labels("receiver", queue).set(depth)
            BUFFER_OLDEST_AGE.labels("receiver", queue).set(oldest_age_s(self.buffer, queue))
        return depths


def queue_depths(buffer: LocalQueue) -> dict[str, int]:
    """Entries waiting per queue of a receiver buffer."""
    return {q: buffer.depth(q) for q in QUEUES}


def oldest_age_s(buffer: LocalQueue, queue: str) -> float:
    """Seconds the oldest waiting message of a queue has waited (0 when empty)."""
    oldest = None
    for partition in buffer.partitions(queue):
        first = buffer.read(queue, 1, partition=partition)
        if first:
            accepted = decode(first[0][1]).accepted_at
            oldest = accepted if oldest is None else min(oldest, accepted)
    return 0.0 if oldest is None else max(0.0, (utcnow() - oldest).total_seconds())
