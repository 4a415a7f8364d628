"""The circuit breaker stops pushes to a subscriber that keeps failing and probes it."""

from __future__ import annotations

import asyncio

from msgbus.delivery.breaker import CircuitBreaker, says_unhealthy
from msgbus.models import AttemptResult, utcnow


def _result(status: int | None, error: str | None = None) -> AttemptResult:
    return AttemptResult(message_id="m", subscription="d/s", attempt=1, started_at=utcnow(),
                         latency_ms=1.0, status_code=status,
                         error=error if status is None else (None if status < 300 else "x"))


async def _admitted_within(breaker: CircuitBreaker, seconds: float) -> bool:
    # an upper bound with room: a loaded CI machine delays the event loop by 100s of ms
    try:
        await asyncio.wait_for(breaker.admit(), seconds)
        return True
    except TimeoutError:
        return False


def test_only_failures_about_the_subscriber_count() -> None:
    assert says_unhealthy(_result(500)) and says_unhealthy(_result(503))
    assert says_unhealthy(_result(429)) and says_unhealthy(_result(None, "timeout"))
    assert not says_unhealthy(_result(200))
    assert not says_unhealthy(_result(400)) and not says_unhealthy(_result(410))


async def test_opens_after_threshold_failures_then_one_probe_closes_it() -> None:
    breaker = CircuitBreaker("d/s", threshold=3, cooldowns_s=(0.2, 0.5))
    for _ in range(2):
        breaker.record(_result(500))
    breaker.record(_result(400))  # the subscriber answered, about one message: a new run
    for _ in range(2):
        breaker.record(_result(500))
    assert not breaker.is_open
    breaker.record(_result(500))
    assert breaker.is_open
    assert not await _admitted_within(breaker, 0.1), "pushed while open"
    assert await _admitted_within(breaker, 2.0), "no probe after the cooldown"
    # while the probe is out, nobody else is let through
    assert not await _admitted_within(breaker, 0.2)
    breaker.record(_result(200))
    assert not breaker.is_open
    assert await _admitted_within(breaker, 0.01)


async def test_a_failed_probe_reopens_for_a_longer_cooldown() -> None:
    breaker = CircuitBreaker("d/s", threshold=1, cooldowns_s=(0.1, 0.4))
    breaker.record(_result(None, "connection refused"))
    assert await _admitted_within(breaker, 2.0)  # the probe
    breaker.record(_result(503))
    assert breaker.is_open
    assert not await _admitted_within(breaker, 0.25), "the second cooldown is the longer one"
    assert await _admitted_within(breaker, 2.0)


async def test_a_success_of_a_push_already_in_flight_closes_it() -> None:
    breaker = CircuitBreaker("d/s", threshold=2, cooldowns_s=(10.0,))
    breaker.record(_result(500))
    breaker.record(_result(500))
    waiter = asyncio.ensure_future(breaker.admit())
    await asyncio.sleep(0.05)
    assert not waiter.done()
    breaker.record(_result(204))
    await asyncio.wait_for(waiter, 1.0)


async def test_a_probe_that_was_not_made_lets_the_next_push_probe() -> None:
    """The compensator may drop an admitted push (its claim's lease is running out): the
    circuit must not wait forever for that probe's outcome."""
    breaker = CircuitBreaker("d/s", threshold=1, cooldowns_s=(0.1,))
    breaker.record(_result(500))
    assert await _admitted_within(breaker, 2.0)  # the probe ...
    breaker.forgo()  # ... was not pushed
    assert await _admitted_within(breaker, 1.0), "no new probe after a forgone one"
