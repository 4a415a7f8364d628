"""Retries of a batch subscription: the claimed due deliveries go as batch pushes, so a
subscriber that takes batches always gets the batch format (a batch of one is fine). Each batch
takes one slot of the limiter; each message's outcome counts its own attempts."""

from __future__ import annotations

import asyncio

from msgbus.delivery.attempt import outcome_of, push_batch_through
from msgbus.delivery.batch import BatchPush, batches_of
from msgbus.delivery.limiter import SubscriptionLimiter
from msgbus.delivery.sender import Sender
from msgbus.metrics import RETRIES
from msgbus.models import DeliveryOutcome, Envelope, Subscription, utcnow
from msgbus.store.claims import ClaimedDelivery

LEASE_MARGIN_S = 1.0  # as the single retries: a push must end this long before the lease


def claim_size(sub: Subscription, claim_batch: int) -> tuple[int, int]:
    """(how many deliveries to claim at once, how many rounds of pushes they take)."""
    batch_messages = sub.batch_max_messages or 1
    size = max(1, min(claim_batch, 4 * sub.max_concurrency * batch_messages))
    pushes = -(-size // batch_messages)
    return size, -(-pushes // sub.max_concurrency)


async def retry_in_batches(sub: Subscription, limiter: SubscriptionLimiter, sender: Sender,
                           ready: list[tuple[ClaimedDelivery, Envelope]],
                           closing: asyncio.Event) -> list[DeliveryOutcome | None]:
    """One outcome per entry of `ready`, in its order; None where no push was made (closing,
    or the lease would run out first)."""
    claims = {env.message_id: claimed for claimed, env in ready}
    batches = batches_of(((env, claimed.attempts + 1) for claimed, env in ready), sub)
    pushed = await asyncio.gather(*(_push(sub, limiter, sender, batch, claims, closing)
                                    for batch in batches))
    by_id = {o.result.message_id: o for outcomes in pushed for o in outcomes}
    return [by_id.get(env.message_id) for _, env in ready]


async def _push(sub: Subscription, limiter: SubscriptionLimiter, sender: Sender,
                batch: BatchPush, claims: dict[str, ClaimedDelivery],
                closing: asyncio.Event) -> list[DeliveryOutcome]:
    if not await limiter.acquire(closing):
        return []
    lease_until = min(claims[e.message_id].lease_until for e in batch.envelopes)
    if (lease_until - utcnow()).total_seconds() < sub.timeout_ms / 1000 + LEASE_MARGIN_S:
        limiter.release(None)  # another compensator may claim them by now
        RETRIES.labels(sub.id, "skipped").inc(len(batch))
        return []
    results = await push_batch_through(limiter, sender, batch, sub)
    outcomes = []
    for result, envelope in zip(results, batch.envelopes, strict=True):
        claimed = claims[envelope.message_id]
        outcome = outcome_of(result, envelope, sub, attempts_so_far=claimed.policy_attempts,
                             age_from=claimed.age_from)
        RETRIES.labels(sub.id, "delivered" if result.ok else "parked" if outcome.parked
                       else "failed").inc()
        outcomes.append(outcome)
    return outcomes
