"""`RetryRounds`: the compensator's one scan per round for due work, across subscriptions.

Every `scan_interval_s` one scan (`DeliveryClaims.subscriptions_due`) names the subscriptions
that have a failed or a scheduled delivery due; each one found that is not being drained gets a
task of its own that drains it under its own limiter (`SubscriptionRetrier.drain`). So an idle
subscription costs nothing per round, and one with a large backlog of due retries takes its own
task and its own cap, never the others' turn: while it drains, the next rounds find and start
the others.

A round looks at up to `SCAN_LIMIT` subscriptions; when there are more, the next round goes on
after the last one it found, so each is reached within a few rounds.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable

from compensator.retrier import SubscriptionRetrier
from msgbus.models import Subscription, utcnow
from msgbus.store.claims import DeliveryClaims
from msgbus.tasks import PeriodicWork, cancel_and_wait

SCAN_LIMIT = 1_000  # subscriptions a round looks at
# at close, pushes under way finish within this long; claimed deliveries not pushed yet are
# given back at once
CLOSE_GRACE_S = 10.0

MakeRetrier = Callable[[str, asyncio.Event], SubscriptionRetrier]


class RetryRounds(PeriodicWork):
    def __init__(self, claims: DeliveryClaims, subscriptions: Callable[[], list[Subscription]],
                 make_retrier: MakeRetrier, *, interval_s: float,
                 ready: Callable[[], Awaitable[object]] | None = None) -> None:
        """`subscriptions`: the registry's; `make_retrier`: a subscription's retrier, given its
        id and the event set at close."""
        super().__init__()
        self._claims = claims
        self._subscriptions = subscriptions
        self._make_retrier = make_retrier
        self._retriers: dict[str, SubscriptionRetrier] = {}  # kept for their limiters
        self._drains: dict[str, asyncio.Task[None]] = {}
        self._after: str | None = None  # where the next round's scan goes on from
        self.every(interval_s, self.round, what="retry round", ready=ready)

    @property
    def draining(self) -> list[str]:
        """The subscriptions whose retries are being pushed now."""
        return sorted(self._drains)

    async def round(self) -> int:
        """One scan; starts a drain for each subscription found that has none. Returns how
        many it started."""
        waiting = {sub.id: sub for sub in self._subscriptions()
                   if not sub.paused and sub.id not in self._drains}
        found = await self._claims.subscriptions_due(utcnow(), waiting, after=self._after,
                                                     limit=SCAN_LIMIT)
        self._after = found[-1] if len(found) >= SCAN_LIMIT else None
        started = 0
        for sub_id in found:
            if sub_id in waiting and sub_id not in self._drains and not self._closing.is_set():
                self._drain(sub_id)
                started += 1
        return started

    def _drain(self, sub_id: str) -> None:
        retrier = self._retriers.get(sub_id)
        if retrier is None:
            retrier = self._retriers[sub_id] = self._make_retrier(sub_id, self._closing)
        task = asyncio.create_task(retrier.drain(), name=f"retry {sub_id}")
        self._drains[sub_id] = task
        task.add_done_callback(functools.partial(self._drained, sub_id))

    def _drained(self, sub_id: str, _task: asyncio.Task[None]) -> None:
        self._drains.pop(sub_id, None)

    def forget(self, sub_id: str) -> None:
        """The subscription is gone: its retrier goes (a drain under way ends by itself, as
        the registry no longer has it)."""
        self._retriers.pop(sub_id, None)

    async def close(self) -> None:
        await super().close()  # sets `_closing`: drains push nothing new
        drains = list(self._drains.values())
        if drains:
            await asyncio.wait(drains, timeout=CLOSE_GRACE_S)
            await cancel_and_wait(*drains)
