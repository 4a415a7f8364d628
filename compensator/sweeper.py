"""`Sweeper`: finds deliveries left pending too long and hands them to the retries; and the
per-subscription retry gauges (due, waiting, parked, oldest retry age).

Each pass first asks which subscriptions have anything for it, with one look-up per such
subscription across all of them (msgbus/store/skipscan.py), then works on those only: a pass
over 1,000 idle subscriptions is a few look-ups. Every query is one subscription's range of an
index — (subscription, recorded_at) of the pending batches, (subscription, status, created_at)
or (subscription, status, next_attempt_at) of the deliveries — so a sweep costs what was
delivered and what is due, not what is stored.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

from msgbus.metrics import (
    OLDEST_RETRY_AGE,
    PARKED,
    RETRIES_DUE,
    RETRIES_WAITING,
    SCHEDULED_WAITING,
    SWEEP_SECONDS,
    SWEPT,
)
from msgbus.models import Subscription, utcnow
from msgbus.settings import CompensatorSettings
from msgbus.store.claims import DeliveryClaims, SubscriptionRetryStats
from msgbus.store.pending import KeyOrder, PendingSweep
from msgbus.tasks import GAUGE_MAX_BUSY, PeriodicWork

log = logging.getLogger(__name__)

SWEEP_BATCH = 5000  # pending deliveries of earlier versions per query
PENDING_PAGE = 50  # pending batches per query
# A pending batch is first looked at this long after it was recorded: by then most of its
# messages have an outcome, so one look settles them.
SETTLE_AFTER_S = 5.0
STATS_CAP = 1_000_000
NOTHING_OPEN = SubscriptionRetryStats(due=0, waiting=0, oldest_failed_at=None, parked=0,
                                      scheduled=0)


class Sweeper(PeriodicWork):
    def __init__(self, claims: DeliveryClaims, pending: PendingSweep,
                 subscriptions: Callable[[], list[Subscription]],
                 settings: CompensatorSettings,
                 ready: Callable[[], Awaitable[object]] | None = None) -> None:
        """`ready`: the MongoDB gate's `wait_available` (no pass waits on a MongoDB that is
        known to be unavailable)."""
        super().__init__()
        self._claims = claims
        self._pending = pending
        self._subscriptions = subscriptions
        self._settings = settings
        self.last_sweep_s: float | None = None
        self.swept = 0
        self.every(settings.sweep_interval_s, self.sweep, what="sweep", ready=ready)
        self.every(settings.settle_interval_s, self.settle, what="settle", ready=ready)
        self.every(settings.stats_interval_s, self.update_stats, what="retry stats",
                   max_busy=GAUGE_MAX_BUSY, ready=ready)

    def sweepable(self) -> list[Subscription]:
        """Not paused, and not changed (e.g. resumed) within the sweep threshold: a resumed
        subscription's dispatcher is still working through what waited in the broker."""
        cutoff = utcnow() - timedelta(seconds=self._settings.sweep_after_s)
        return [s for s in self._subscriptions() if not s.paused and s.updated_at < cutoff]

    async def sweep(self) -> int:
        """One pass over every sweepable subscription with something pending: what has no
        outcome after the threshold is swept into the retries (and what has one leaves the
        pending batches on the way). Returns how many deliveries it swept."""
        began = time.perf_counter()
        older_than = utcnow() - timedelta(seconds=self._settings.sweep_after_s)
        sweepable = {sub.id: sub for sub in self.sweepable()}
        found = (set(await self._pending.subscriptions_with_batches(older_than, sweepable))
                 | set(await self._claims.subscriptions_with_pending(older_than, sweepable)))
        total = 0
        for sub in (sweepable[sub_id] for sub_id in sorted(found) if sub_id in sweepable):
            order = KeyOrder() if sub.ordered_by_biz_id else None
            swept = await self._sweep_batches(sub.id, older_than, order, sub.delay_s)
            swept += await self._sweep_pending_states(sub.id, older_than)
            if swept:
                SWEPT.labels(sub.id).inc(swept)
                log.warning("%s: %d deliveries pending since before %s swept into the "
                            "retries", sub.id, swept, older_than.isoformat())
            total += swept
        self.last_sweep_s = time.perf_counter() - began
        self.swept += total
        SWEEP_SECONDS.observe(self.last_sweep_s)
        return total

    async def settle(self) -> None:
        """Between sweeps: the messages that got an outcome leave the pending batches of every
        subscription that is not paused, also one the sweep skips (changed within the
        threshold), so that the backlog gauges count what is left."""
        active = {sub.id for sub in self._subscriptions() if not sub.paused}
        for sub_id in await self._pending.subscriptions_with_batches(self._settle_before(),
                                                                     active):
            if sub_id in active:
                await self._sweep_batches(sub_id, None)

    def _settle_before(self) -> datetime:
        """A batch recorded since then is not looked at yet (most of its messages are still
        on their way)."""
        return utcnow() - timedelta(seconds=min(SETTLE_AFTER_S, self._settings.sweep_after_s))

    async def _sweep_batches(self, sub_id: str, older_than: datetime | None,
                             order: KeyOrder | None = None, delay_s: float = 0.0) -> int:
        """Settles the subscription's pending batches; sweeps what is older than `older_than`
        (None: nothing), of an ordered subscription only the keys' heads. Returns how many it
        swept."""
        settle_before = self._settle_before()
        swept = 0
        while True:
            done = await self._pending.run(sub_id, settle_before=settle_before,
                                           sweep_before=older_than, limit=PENDING_PAGE,
                                           order=order, delay_s=delay_s)
            swept += done.swept
            if done.reached_dispatcher or done.batches < PENDING_PAGE:
                return swept

    async def _sweep_pending_states(self, sub_id: str, older_than: datetime) -> int:
        """Pending delivery states, as versions before the pending batches wrote them."""
        swept = 0
        while True:
            found = await self._claims.sweep_pending(sub_id, older_than, SWEEP_BATCH)
            swept += found
            if found < SWEEP_BATCH:
                return swept

    async def update_stats(self) -> None:
        """Counted for the subscriptions that have a failed, parked or scheduled delivery;
        every other one's gauges are zero."""
        now = utcnow()
        subscriptions = self._subscriptions()
        with_open = set(await self._claims.subscriptions_with_open([s.id for s in subscriptions]))
        for sub in subscriptions:
            stats = (await self._claims.stats(sub.id, STATS_CAP) if sub.id in with_open
                     else NOTHING_OPEN)
            RETRIES_DUE.labels(sub.id).set(stats.due)
            RETRIES_WAITING.labels(sub.id).set(stats.waiting)
            PARKED.labels(sub.id).set(stats.parked)
            SCHEDULED_WAITING.labels(sub.id).set(stats.scheduled)
            age = (now - stats.oldest_failed_at).total_seconds() if stats.oldest_failed_at else 0
            OLDEST_RETRY_AGE.labels(sub.id).set(max(0.0, age))
