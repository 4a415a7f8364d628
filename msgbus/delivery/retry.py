"""The retry decision: a pure function of the policy, the attempt count and the answer."""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta

from msgbus.models import AttemptResult, RetryPolicy

JITTER_FRACTION = 0.1


@dataclass(frozen=True, slots=True)
class RetryDecision:
    park: bool
    next_attempt_at: datetime | None


def decide_retry(
    policy: RetryPolicy, result: AttemptResult, *, attempts_so_far: int,
    first_created_at: datetime, now: datetime, rng: random.Random | None = None,
) -> RetryDecision:
    """After a failed attempt: park (give up by policy), or retry at `next_attempt_at`."""
    if result.status_code in policy.permanent_status_codes:
        return RetryDecision(park=True, next_attempt_at=None)
    if policy.max_attempts is not None and attempts_so_far >= policy.max_attempts:
        return RetryDecision(park=True, next_attempt_at=None)
    if policy.max_age_s is not None and (now - first_created_at).total_seconds() > policy.max_age_s:
        return RetryDecision(park=True, next_attempt_at=None)
    delays = policy.delays_s or [60.0]
    delay = delays[min(attempts_so_far - 1, len(delays) - 1)] if attempts_so_far > 0 else delays[0]
    delay *= 1 + (rng or random).uniform(-JITTER_FRACTION, JITTER_FRACTION)
    if result.retry_after_s is not None:
        delay = max(delay, result.retry_after_s)
    return RetryDecision(park=False, next_attempt_at=now + timedelta(seconds=delay))
