"""msgbus.throttle: failures are answered at once, then slowed (doubling), then locked out
(429 with Retry-After, doubling up to a maximum); a lock ends by itself, a success clears the
user's counts, and a kind without a lock only slows."""

from __future__ import annotations

import asyncio

import pytest

from msgbus.throttle import MemoryFailures, Policy, Throttle, TooManyAttempts


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


PAIR = Policy(free=3, slow_max_s=2.0, lock_after=6, lock_first_s=30.0, lock_max_s=100.0,
              window_s=900.0)
SLOW_ONLY = Policy(free=5, slow_max_s=4.0, lock_after=None)


def _throttle(clock: Clock) -> Throttle:
    return Throttle(MemoryFailures(), {"pair": PAIR, "user": SLOW_ONLY}, clock)


def test_failures_are_slowed_then_locked_and_the_lock_doubles_up_to_its_maximum() -> None:
    async def scenario() -> tuple[list[float], list[int]]:
        clock = Clock()
        throttle = _throttle(clock)
        keys = {"pair": "ana|10.0.0.7"}
        delays = [await throttle.failed(keys) for _ in range(6)]
        retry_after = []
        for _ in range(3):  # each failure past the lock doubles it, up to the maximum
            with pytest.raises(TooManyAttempts) as locked:
                await throttle.check(keys)
            assert locked.value.status_code == 429
            retry_after.append(locked.value.retry_after_s or 0)
            clock.now += retry_after[-1]  # the lock ends by itself
            await throttle.check(keys)
            await throttle.failed(keys)
        return delays, retry_after

    delays, retry_after = asyncio.run(scenario())
    assert delays == [0, 0, 0, 0.25, 0.5, 1.0]
    assert retry_after == [30, 60, 100]


def test_a_success_clears_the_counts_and_old_failures_are_forgotten() -> None:
    async def scenario() -> list[float]:
        clock = Clock()
        throttle = _throttle(clock)
        keys = {"pair": "ana|10.0.0.7"}
        for _ in range(5):
            await throttle.failed(keys)
        await throttle.succeeded(keys)
        after_success = await throttle.failed(keys)
        for _ in range(4):
            await throttle.failed(keys)
        clock.now += PAIR.window_s + 1
        after_window = await throttle.failed(keys)
        return [after_success, after_window]

    assert asyncio.run(scenario()) == [0, 0]


def test_a_kind_without_a_lock_is_only_slowed_at_most_its_maximum() -> None:
    async def scenario() -> float:
        throttle = _throttle(Clock())
        keys = {"user": "ana"}
        delays = [await throttle.failed(keys) for _ in range(40)]
        await throttle.check(keys)  # never locked: nobody keeps a user out by failing as them
        return max(delays)

    assert asyncio.run(scenario()) == SLOW_ONLY.slow_max_s


def test_the_locked_keys_are_listed() -> None:
    async def scenario() -> list[str]:
        throttle = _throttle(Clock())
        for _ in range(6):
            await throttle.failed({"pair": "ana|10.0.0.7"})
        await throttle.failed({"pair": "bob|10.0.0.8"})
        return list(await throttle.locked())

    assert asyncio.run(scenario()) == ["pair:ana|10.0.0.7"]
