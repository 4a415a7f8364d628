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

At-least-once stays: when MongoDB does not answer in time, the messages are pushed. Lookups go
through the store's gate (`msgbus.store.gate`): once one has timed out, none is tried until a
probe finds MongoDB back, so an outage holds one batch for the lookup timeout, not every batch
of a backlog.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from datetime import datetime

from msgbus.metrics import REDELIVERIES_SKIPPED
from msgbus.models import Envelope, utcnow
from msgbus.store import MongoStore

log = logging.getLogger(__name__)

LOOKUP_TIMEOUT_S = 2.0
REMEMBERED = 200_000  # (subscription, message id) pairs, ~100 bytes each


class DeliveredCheck:
    def __init__(self, store: MongoStore, *, after_s: float,
                 timeout_s: float = LOOKUP_TIMEOUT_S, remember: int = REMEMBERED) -> None:
        self._store = store
        self._after_s = after_s
        self._timeout_s = timeout_s
        self._capacity = remember
        self._delivered: OrderedDict[tuple[str, str], None] = OrderedDict()

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
        if not suspects:
            return known
        gate = self._store.gate
        if not gate.available:
            gate.refuse("redelivery check")  # counted; pushed without a look-up
            return known
        try:
            async with gate.guard("redelivery check", self._timeout_s):
                found = await self._store.progress.handled_among(subscription, suspects)
        except Exception as exc:  # MongoDB down or slow: push them (at least once)
            log.warning("%s: cannot tell which messages were delivered already (%r); pushing "
                        "them", subscription, exc)
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
