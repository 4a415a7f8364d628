"""`DeliveredCheck`: keeps a subscriber from getting again what it already has, and the
dispatcher from pushing again what it handed to the compensator.

A broker hands a message out again after a dispatcher restart or a consumer rebalance (from the
last committed offset, or every unacked RabbitMQ message), a receiver re-publishes what a
predecessor left in its buffer, and a message that waited in a backlog longer than the
compensator's sweep threshold has meanwhile been pushed by the compensator.

Two sources answer "handled already?" — delivered, or failed and so with the compensator's
retries (a second first push beside its retry would be a duplicate):
- this process's memory of what it handled (the newest `remember` outcomes, and at start
  the delivered outcomes a killed predecessor left on local disk): it answers at once, also
  while MongoDB is down or lags behind the trace, which is when redeliveries come;
- MongoDB, for what another process handled, one query per received batch. Only messages
  that may have been pushed before are looked up there: those flagged `redelivered` (by the
  broker adapter or a re-publishing receiver) and those older than `after_s` (which must stay
  below the compensator's sweep threshold). A first hand-out, the bulk of the traffic also
  when a backlog builds, costs MongoDB nothing.

At-least-once stays: when MongoDB does not answer in time, the messages are pushed, and for
the next `pause_s` no lookup is tried, so that a MongoDB outage does not hold every batch of a
backlog for the lookup timeout.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from datetime import datetime

from msgbus.metrics import REDELIVERIES_SKIPPED
from msgbus.models import Envelope, utcnow
from msgbus.store import MongoStore
from msgbus.tasks import detached_task

log = logging.getLogger(__name__)

LOOKUP_TIMEOUT_S = 2.0
PAUSE_AFTER_FAILURE_S = 10.0
REMEMBERED = 200_000  # (subscription, message id) pairs, ~100 bytes each


class DeliveredCheck:
    def __init__(self, store: MongoStore, *, after_s: float,
                 timeout_s: float = LOOKUP_TIMEOUT_S,
                 pause_s: float = PAUSE_AFTER_FAILURE_S, remember: int = REMEMBERED) -> None:
        self._store = store
        self._after_s = after_s
        self._timeout_s = timeout_s
        self._pause_s = pause_s
        self._paused_until = 0.0  # monotonic; no lookups before, after a failed one
        self._capacity = remember
        self._delivered: OrderedDict[tuple[str, str], None] = OrderedDict()
        # per subscription: a lookup that outlived its timeout runs on (cancelling a MongoDB
        # call mid-flight costs its connection); none other of that subscription starts
        # meanwhile, while other subscriptions' lookups (e.g. all redelivered at a restart) do
        self._lookups: dict[str, asyncio.Task[set[str]]] = {}

    def remember(self, delivered: Iterable[tuple[str, str]]) -> None:
        """(subscription, message id) pairs this process delivered; the oldest are forgotten
        beyond the capacity."""
        for pair in delivered:
            self._delivered[pair] = None
        while len(self._delivered) > self._capacity:
            self._delivered.popitem(last=False)

    async def already_delivered(self, subscription: str,
                                envelopes: Sequence[Envelope]) -> set[str]:
        """The message ids among `envelopes` delivered to `subscription` already: as this
        process remembers, or (only redelivered or old ones, and none when MongoDB does not
        answer in time) as MongoDB records."""
        now = utcnow()
        known = {e.message_id for e in envelopes
                 if (subscription, e.message_id) in self._delivered}
        if known:
            REDELIVERIES_SKIPPED.labels(subscription).inc(len(known))
            log.info("%s: %d messages handed out again were handled by this process; not "
                     "pushed again", subscription, len(known))
        suspects = [e.message_id for e in envelopes if e.message_id not in known and (
            e.redelivered or (now - _first_seen(e)).total_seconds() >= self._after_s)]
        running = self._lookups.get(subscription)
        if (not suspects or time.monotonic() < self._paused_until
                or (running is not None and not running.done())):
            return known
        lookup = self._lookups[subscription] = detached_task(
            self._store.handled_among(subscription, suspects))
        try:
            found = await asyncio.wait_for(asyncio.shield(lookup), self._timeout_s)
        except Exception as exc:  # MongoDB down or slow: push them (at least once)
            self._paused_until = time.monotonic() + self._pause_s
            log.warning("%s: cannot tell which messages were delivered already (%r); pushing "
                        "them, and not looking up for %.0f s", subscription, exc, self._pause_s)
            return known
        if found:
            REDELIVERIES_SKIPPED.labels(subscription).inc(len(found))
            log.info("%s: %d of %d messages handed out again were delivered or are with the "
                     "retries already; not pushed again", subscription, len(found),
                     len(suspects))
        return known | found


def _first_seen(envelope: Envelope) -> datetime:
    """The older of its creation (the sweep's clock: a client may have spooled it for a while)
    and its acceptance."""
    if envelope.received_at is None:
        return envelope.created_at
    return min(envelope.created_at, envelope.received_at)
