"""The circuit breaker stops pushes to a subscriber that seems down, probes it, and hears what
the other processes pushing to the same subscription saw."""

from __future__ import annotations

import asyncio
import itertools
import time

from msgbus.delivery.breaker import CircuitBreaker, Evidence, says_unhealthy
from msgbus.models import AttemptResult, CircuitPolicy, utcnow

_ids = (f"m{n}" for n in itertools.count())


def _result(status: int | None, error: str | None = None, *,
            message_id: str | None = None, attempt: int = 1) -> AttemptResult:
    return AttemptResult(message_id=message_id or next(_ids), subscription="d/s",
                         attempt=attempt,
                         started_at=utcnow(), latency_ms=1.0, status_code=status,
                         error=error if status is None else (None if status < 300 else "x"))


def _breaker(threshold: int, cooldowns_s: list[float], alive_window_s: float = 0.0
             ) -> CircuitBreaker:
    return CircuitBreaker("d/s", CircuitPolicy(open_after_failures=threshold,
                                               cooldowns_s=cooldowns_s,
                                               alive_window_s=alive_window_s))


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
    breaker = _breaker(3, [0.2, 0.5])
    for _ in range(2):
        breaker.record(_result(500))
    breaker.record(_result(400))  # the subscriber answered, about one message: a new count
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


def test_the_same_message_failing_again_counts_once() -> None:
    breaker = _breaker(3, [10.0])
    for _ in range(10):
        breaker.record(_result(500, message_id="poison"))
    breaker.record(_result(503, message_id="other"))
    assert not breaker.is_open
    breaker.record(_result(503, message_id="third"))
    assert breaker.is_open


def test_failed_retries_do_not_count_they_are_the_same_messages_failing_again() -> None:
    breaker = _breaker(3, [10.0])
    for attempt in (2, 3, 4):
        for n in range(5):
            breaker.record(_result(500, message_id=f"m{n}", attempt=attempt))
    assert not breaker.is_open
    for n in range(3):
        breaker.record(_result(500, message_id=f"new{n}"))
    assert breaker.is_open


def test_failures_do_not_open_it_while_the_subscriber_answered_recently() -> None:
    breaker = _breaker(3, [10.0], alive_window_s=60)
    breaker.record(_result(204))
    for _ in range(50):
        breaker.record(_result(500))
    assert not breaker.is_open


async def test_a_failed_probe_reopens_for_a_longer_cooldown() -> None:
    breaker = _breaker(1, [0.1, 0.4])
    breaker.record(_result(None, "connection refused"))
    assert await _admitted_within(breaker, 2.0)  # the probe
    breaker.record(_result(503))
    assert breaker.is_open
    assert not await _admitted_within(breaker, 0.25), "the second cooldown is the longer one"
    assert await _admitted_within(breaker, 2.0)


async def test_a_success_of_a_push_already_in_flight_closes_it() -> None:
    breaker = _breaker(2, [10.0])
    breaker.record(_result(500))
    breaker.record(_result(500))
    waiter = asyncio.ensure_future(breaker.admit())
    await asyncio.sleep(0)  # the waiter waits for the cooldown
    assert not waiter.done()
    breaker.record(_result(204))
    await asyncio.wait_for(waiter, 1.0)


async def test_a_probe_that_was_not_made_lets_the_next_push_probe() -> None:
    """The compensator may drop an admitted push (its claim's lease is running out): the
    circuit must not wait forever for that probe's outcome."""
    breaker = _breaker(1, [0.1])
    breaker.record(_result(500))
    assert await _admitted_within(breaker, 2.0)  # the probe ...
    breaker.forgo()  # ... was not pushed
    assert await _admitted_within(breaker, 1.0), "no new probe after a forgone one"


# ---- one circuit across processes ------------------------------------------------------


def test_a_success_in_another_process_closes_an_open_circuit() -> None:
    breaker = _breaker(2, [60.0])
    breaker.record(_result(500))
    breaker.record(_result(500))
    assert breaker.is_open
    now = time.time()
    breaker.hear([Evidence(ok_at=now + 0.01, answered_at=now + 0.01)])
    assert not breaker.is_open


def test_failures_in_other_processes_open_it_here() -> None:
    breaker = _breaker(10, [60.0])
    breaker.record(_result(500))
    breaker.hear([Evidence(failures=5), Evidence(failures=4)])
    assert breaker.is_open


def test_a_recent_success_elsewhere_keeps_it_closed() -> None:
    """The dispatcher's first pushes fail while the compensator's retries succeed: alive."""
    breaker = _breaker(3, [60.0], alive_window_s=30)
    now = time.time()
    breaker.hear([Evidence(ok_at=now, answered_at=now)])
    for _ in range(100):
        breaker.record(_result(500))
    assert not breaker.is_open


def test_counts_made_before_the_newest_answer_are_left_out() -> None:
    breaker = _breaker(3, [60.0])
    now = time.time()
    breaker.hear([Evidence(answered_at=now, ok_at=now),  # a success just now ...
                  Evidence(failures=50, counted_since=now - 5)])  # ... after their failures
    assert not breaker.is_open
    assert breaker.report().counted_since == now
