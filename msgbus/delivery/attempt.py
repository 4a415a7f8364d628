"""One delivery attempt, as the dispatcher and the compensator make it: push the message through
a limiter's slot, then turn the subscriber's answer into an outcome with the retry decision."""

from __future__ import annotations

import dataclasses
import functools
from datetime import datetime
from typing import Any

from msgbus.delivery.batch import BatchPush
from msgbus.delivery.limiter import SubscriptionLimiter
from msgbus.delivery.retry import decide_retry
from msgbus.delivery.sender import Sender
from msgbus.metrics import BATCH_SIZE, PUSH_LATENCY, PUSHES
from msgbus.models import AttemptResult, DeliveryOutcome, Envelope, Subscription, utcnow


@functools.lru_cache(maxsize=4096)
def _metrics(subscription_id: str) -> tuple[dict[str, Any], Any]:
    """The subscription's metric children, looked up once (this is the hot path)."""
    pushes = {label: PUSHES.labels(subscription_id, label)
              for label in ("delivered", "failed", "parked")}
    return pushes, PUSH_LATENCY.labels(subscription_id)


async def push_through(limiter: SubscriptionLimiter, sender: Sender, envelope: Envelope,
                       subscription: Subscription, attempt: int) -> AttemptResult:
    """Called with a slot of `limiter` acquired; frees it once the subscriber has answered
    (recording the outcome afterwards does not hold the subscriber's slot)."""
    result: AttemptResult | None = None
    try:
        result = await sender.push(envelope, subscription, attempt=attempt)
        return result
    finally:
        limiter.release(result)


async def push_batch_through(limiter: SubscriptionLimiter, sender: Sender, batch: BatchPush,
                             subscription: Subscription) -> list[AttemptResult]:
    """A batch push in one slot of `limiter`. The circuit counts it as one result: as one
    message (the batch's id) on its first push, however many messages it holds."""
    results: list[AttemptResult] = []
    try:
        results = await sender.push_batch(batch, subscription)
        BATCH_SIZE.labels(subscription.id).observe(len(batch))
        return results
    finally:
        limiter.release(dataclasses.replace(results[0], message_id=batch.batch_id,
                                            attempt=min(batch.attempts))
                        if results else None)


def skipped_outcome(envelope: Envelope, subscription: Subscription, reason: str,
                    instance: str) -> DeliveryOutcome:
    """Not pushed on purpose (filtered out, or skipped by an operator): recorded as skipped,
    never retried."""
    result = AttemptResult(
        message_id=envelope.message_id, subscription=subscription.id, attempt=0,
        started_at=utcnow(), latency_ms=0.0, error=reason, instance=instance)
    return DeliveryOutcome(result=result, destination=envelope.destination,
                           created_at=envelope.created_at, biz_id=envelope.biz_id, skipped=True)


def outcome_of(result: AttemptResult, envelope: Envelope, subscription: Subscription, *,
               attempts_so_far: int, retry_in_place: bool = False,
               age_from: datetime | None = None) -> DeliveryOutcome:
    """The delivery state an attempt leads to; counts it in the push metrics.

    `attempts_so_far` (this one included) and `age_from` (default: the message's creation)
    are what the policy's max_attempts and max_age_s are measured against."""
    outcome = DeliveryOutcome(result=result, destination=envelope.destination,
                              created_at=envelope.created_at, biz_id=envelope.biz_id)
    if result.ok:
        label = "delivered"
    else:
        decision = decide_retry(subscription.retry_policy, result,
                                attempts_so_far=attempts_so_far,
                                first_created_at=age_from or envelope.created_at, now=utcnow())
        outcome.parked, outcome.next_attempt_at = decision.park, decision.next_attempt_at
        outcome.retrying_in_place = retry_in_place and not decision.park
        label = "parked" if outcome.parked else "failed"
    pushes, latency = _metrics(subscription.id)
    pushes[label].inc()
    latency.observe(result.latency_ms / 1000)
    return outcome
