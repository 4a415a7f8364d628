"""`SubscriptionRetrier`: one subscription's retries — claim the failed and scheduled
deliveries that are due, push each through the subscription's limiter (circuit breaker, rate
and concurrency slots, as in the dispatcher), record every attempt on the trace.

It has no loop of its own: the compensator's rounds (`compensator/rounds.py`) find the
subscriptions with something due and have each one's retrier drain it, each in a task of its
own, so a subscriber that stays broken holds only its own retries back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from compensator.batch_retry import claim_size, retry_in_batches
from msgbus.delivery.attempt import outcome_of, push_through, skipped_outcome
from msgbus.delivery.filters import FILTERED_OUT, why_not_pushed
from msgbus.delivery.limiter import SubscriptionLimiter
from msgbus.delivery.sender import Sender
from msgbus.delivery.shares import CapShares
from msgbus.errors import MongoUnavailable
from msgbus.metrics import RETRIES
from msgbus.models import DeliveryOutcome, Envelope, Subscription, utcnow
from msgbus.settings import CompensatorSettings
from msgbus.store import MongoStore
from msgbus.store.claims import ClaimedDelivery, DeliveryClaims

log = logging.getLogger(__name__)

MISSING_MESSAGE_DELAY_S = 30.0  # its record may still be on its way from a receiver
LEASE_MARGIN_S = 1.0  # a push must be able to end (timeout) this long before the lease does
ERROR_PAUSE_S = 1.0
CLAIM_TIMEOUT_S = 10.0  # a claim and its messages' records: a few round trips


class SubscriptionRetrier:
    def __init__(self, subscription_id: str, current: Callable[[], Subscription | None],
                 claims: DeliveryClaims, store: MongoStore, sender: Sender,
                 settings: CompensatorSettings, shares: CapShares, closing: asyncio.Event, *,
                 on_recorded: Callable[[list[DeliveryOutcome]], None] = lambda _: None) -> None:
        """`closing`: set when the compensator closes (pushes not begun are given back)."""
        self._on_recorded = on_recorded  # the notifier looks for parked outcomes
        self.subscription_id = subscription_id
        self._shares = shares
        self._current = current  # the subscription as configured now (None: deleted)
        self._claims = claims
        self._store = store
        self._sender = sender
        self._settings = settings
        self._closing = closing
        self._limiter: SubscriptionLimiter | None = None
        self._limits: tuple[Any, ...] = ()

    async def drain(self) -> None:
        """Claims and pushes until a claim finds nothing due (or the subscription is paused,
        deleted, or the compensator closes). A failure ends the drain: the next round finds
        what is left."""
        while not self._closing.is_set():
            sub = self._current()
            if sub is None or sub.paused:
                return
            try:
                if not await self.retry_due(sub):
                    return
            except MongoUnavailable as exc:
                log.warning("%s: retries wait for MongoDB (%s)", self.subscription_id, exc)
                return
            except Exception:
                log.exception("%s: retrying failed deliveries failed; the next round tries "
                              "again", self.subscription_id)
                return

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._closing.wait(), seconds)

    def _limiter_for(self, sub: Subscription) -> SubscriptionLimiter:
        limits = (sub.max_concurrency, sub.max_rate_per_s, sub.circuit)
        if self._limiter is None or self._limits != limits:
            self._limiter = self._shares.limiter(sub)
            self._limits = limits
        return self._limiter

    async def retry_due(self, sub: Subscription) -> int:
        """One claim of due retries, pushed and recorded. Returns how many were claimed."""
        batch, rounds = claim_size(sub, self._settings.claim_batch)
        lease_s = self._settings.lease_s + rounds * sub.timeout_ms / 1000
        async with self._store.gate.guard("retry claims", CLAIM_TIMEOUT_S):
            claimed = await self._claims.claim_due(sub.id, batch, lease_s)
            if not claimed:
                return 0
            envelopes = await self._claims.envelopes([c.message_id for c in claimed])
        missing = [c for c in claimed if c.message_id not in envelopes]
        if missing:
            log.warning("%s: %d messages to retry have no record yet; trying again in %.0f s",
                        sub.id, len(missing), MISSING_MESSAGE_DELAY_S)
            RETRIES.labels(sub.id, "skipped").inc(len(missing))
            await self._claims.release(missing, MISSING_MESSAGE_DELAY_S)
        limiter = self._limiter_for(sub)
        ready = [(c, envelopes[c.message_id]) for c in claimed if c.message_id in envelopes]
        skipped = self._skipped_by_operator(sub, ready)
        ready = [(c, env) for c, env in ready if env.message_id not in skipped]
        results = await self._attempts(sub, limiter, ready)
        outcomes = list(skipped.values()) + [o for o in results if o is not None]
        unpushed = [c for (c, _), o in zip(ready, results, strict=True) if o is None]
        await self._record(outcomes)
        if unpushed:
            await self._claims.release(unpushed, 0.0)
        return len(claimed)

    def _skipped_by_operator(self, sub: Subscription,
                             ready: list[tuple[ClaimedDelivery, Envelope]]
                             ) -> dict[str, DeliveryOutcome]:
        """The claimed retries of a backlog an operator skipped: recorded as skipped, not
        pushed. By message id."""
        if sub.skip_before is None:
            return {}
        skipped = {}
        for _, envelope in ready:
            reason = why_not_pushed(sub, envelope)
            if reason is not None and reason != FILTERED_OUT:
                skipped[envelope.message_id] = skipped_outcome(envelope, sub, reason,
                                                               self._sender.instance)
        if skipped:
            RETRIES.labels(sub.id, "skipped").inc(len(skipped))
        return skipped

    async def _attempts(self, sub: Subscription, limiter: SubscriptionLimiter,
                        ready: list[tuple[ClaimedDelivery, Envelope]]
                        ) -> list[DeliveryOutcome | None]:
        """One outcome per entry of `ready` (None: not pushed): batch pushes for a batch
        subscription, else one push each."""
        if sub.batched:
            return await retry_in_batches(sub, limiter, self._sender, ready, self._closing)
        return list(await asyncio.gather(*(self._attempt(sub, limiter, c, env)
                                           for c, env in ready)))

    async def _attempt(self, sub: Subscription, limiter: SubscriptionLimiter,
                       claimed: ClaimedDelivery, envelope: Envelope) -> DeliveryOutcome | None:
        """One retry push; None when it was not made (closing, or the lease would run out)."""
        if not await limiter.acquire(self._closing):
            return None
        left_s = (claimed.lease_until - utcnow()).total_seconds()
        if left_s < sub.timeout_ms / 1000 + LEASE_MARGIN_S:
            limiter.release(None)  # another compensator may claim it by now
            RETRIES.labels(sub.id, "skipped").inc()
            return None
        result = await push_through(limiter, self._sender, envelope, sub, claimed.attempts + 1)
        outcome = outcome_of(result, envelope, sub, attempts_so_far=claimed.policy_attempts,
                             age_from=claimed.age_from)
        label = "delivered" if result.ok else "parked" if outcome.parked else "failed"
        RETRIES.labels(sub.id, label).inc()
        return outcome

    async def _record(self, outcomes: list[DeliveryOutcome]) -> None:
        """Until it works or the compensator closes: an outcome not recorded is pushed again
        when its lease ends (a duplicate, never a loss)."""
        while outcomes:
            try:
                await self._store.records.record_outcomes(outcomes)
                self._on_recorded(outcomes)
                return
            except Exception as exc:
                if self._closing.is_set():
                    log.warning("%s: %d retry outcomes not recorded at close (%s); they are "
                                "retried again when their lease ends", self.subscription_id,
                                len(outcomes), exc)
                    return
                log.warning("%s: recording retry outcomes failed (%s); trying again",
                            self.subscription_id, exc)
                await self._pause(ERROR_PAUSE_S)
