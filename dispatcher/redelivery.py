"""`DeliveredCheck`: keeps a subscriber from getting again what it already has.

A broker hands a message out again after a dispatcher restart or a consumer rebalance (from the
last committed offset, or every unacked RabbitMQ message), and a message that waited in a
backlog longer than the compensator's sweep threshold has meanwhile been pushed by the
compensator. Both are old by the time the dispatcher sees them, while in normal running a
message reaches the dispatcher within a second. So only messages older than `after_s` are
looked up in MongoDB, one query per received batch: normal running costs nothing, and a
backlog costs one indexed read per batch.

At-least-once stays: when MongoDB does not answer in time, the messages are pushed, and for
the next `pause_s` no lookup is tried, so that a MongoDB outage does not hold every batch of a
backlog for the lookup timeout.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from msgbus.metrics import REDELIVERIES_SKIPPED
from msgbus.models import Envelope, utcnow
from msgbus.store import MongoStore

log = logging.getLogger(__name__)

LOOKUP_TIMEOUT_S = 2.0
PAUSE_AFTER_FAILURE_S = 10.0


class DeliveredCheck:
    def __init__(self, store: MongoStore, *, after_s: float,
                 timeout_s: float = LOOKUP_TIMEOUT_S,
                 pause_s: float = PAUSE_AFTER_FAILURE_S) -> None:
        self._store = store
        self._after_s = after_s
        self._timeout_s = timeout_s
        self._pause_s = pause_s
        self._paused_until = 0.0  # monotonic; no lookups before, after a failed one

    async def already_delivered(self, subscription: str,
                                envelopes: Sequence[Envelope]) -> set[str]:
        """The message ids among `envelopes` that MongoDB marks delivered to `subscription`;
        only old messages are looked up, and none when MongoDB does not answer in time."""
        now = utcnow()
        old = [e.message_id for e in envelopes
               if (now - (e.received_at or e.created_at)).total_seconds() >= self._after_s]
        if not old or time.monotonic() < self._paused_until:
            return set()
        try:
            found = await asyncio.wait_for(self._store.delivered_among(subscription, old),
                                           self._timeout_s)
        except Exception as exc:  # MongoDB down or slow: push them (at least once)
            self._paused_until = time.monotonic() + self._pause_s
            log.warning("%s: cannot tell which old messages were delivered already (%s); "
                        "pushing them, and not looking up for %.0f s", subscription,
                        exc or type(exc).__name__, self._pause_s)
            return set()
        if found:
            REDELIVERIES_SKIPPED.labels(subscription).inc(len(found))
            log.info("%s: %d of %d old messages were delivered already; not pushed again",
                     subscription, len(found), len(old))
        return found
