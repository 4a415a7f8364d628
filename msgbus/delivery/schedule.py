"""When a delivery is due: the one rule for delayed delivery, used by the dispatcher (schedule
or push), the compensator's sweep (schedule or retry now) and the admin.

A delivery is due at the later of the message's `deliver_at` (the producer's) and its
acceptance plus the subscription's `delay_s` (Hermes' `sendingDelay`). A due time in the past
is now: a producer's `deliver_at` that passed while the message travelled is delivered at once.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from msgbus.models import AttemptResult, DeliveryOutcome, Envelope, Subscription, utcnow

# A due time this close to now is pushed at once (0: never early, not by a millisecond).
PUSH_NOW_WITHIN_S = 0.0


def due_time(deliver_at: datetime | None, accepted_at: datetime,
             delay_s: float) -> datetime | None:
    """The due time from its parts; None when nothing delays the delivery."""
    by_subscription = accepted_at + timedelta(seconds=delay_s) if delay_s > 0 else None
    if deliver_at is None or (by_subscription is not None and by_subscription > deliver_at):
        return by_subscription
    return deliver_at


def due_at(envelope: Envelope, subscription: Subscription) -> datetime | None:
    """When `envelope` may first be pushed to `subscription`; None: at once."""
    if envelope.deliver_at is None and subscription.delay_s <= 0:
        return None  # the common case, on every message's path: no arithmetic
    return due_time(envelope.deliver_at, envelope.accepted_at, subscription.delay_s)


def wait_until(envelope: Envelope, subscription: Subscription,
               now: datetime | None = None) -> datetime | None:
    """The due time if it is still ahead (beyond `PUSH_NOW_WITHIN_S`); None: push now."""
    due = due_at(envelope, subscription)
    if due is None:
        return None
    if (due - (now or utcnow())).total_seconds() <= PUSH_NOW_WITHIN_S:
        return None
    return due


def scheduled_outcome(envelope: Envelope, subscription: Subscription, due: datetime,
                      instance: str, *, in_place: bool = False) -> DeliveryOutcome:
    """The state of a delivery that waits for `due`: the compensator pushes it then (its
    `next_attempt_at`), or, `in_place`, the dispatcher's lane of an ordered subscription
    holds it (no `next_attempt_at`, so no compensator takes it)."""
    result = AttemptResult(
        message_id=envelope.message_id, subscription=subscription.id, attempt=0,
        started_at=utcnow(), latency_ms=0.0, error=None, instance=instance)
    return DeliveryOutcome(result=result, destination=envelope.destination,
                           created_at=envelope.created_at, biz_id=envelope.biz_id,
                           next_attempt_at=None if in_place else due,
                           retrying_in_place=in_place, scheduled_for=due)
