from __future__ import annotations

import pytest

from msgbus.ratelimit import TokenBucket


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_lets_its_rate_through_per_second_and_never_saves_up_more() -> None:
    clock = FakeClock()
    bucket = TokenBucket(10, clock=clock)
    assert bucket.available() == 0  # starts empty: no burst at start
    clock.now += 0.5
    assert bucket.available() == 5
    bucket.take(5)
    assert bucket.available() == 0
    assert bucket.wait_s() == pytest.approx(0.1)
    clock.now += 3600  # a long idle spell saves up one second's worth, no more
    assert bucket.available() == 10


def test_a_rate_changes_at_once_and_zero_means_unlimited() -> None:
    clock = FakeClock()
    bucket = TokenBucket(0, clock=clock)
    assert bucket.available() >= 1_000_000 and bucket.wait_s() == 0
    bucket.set_rate(2)
    clock.now += 10
    assert bucket.available() == 2
    bucket.set_rate(1)  # lowering the rate drops the tokens above the new capacity
    assert bucket.available() == 1
    with pytest.raises(ValueError, match="rate"):
        bucket.set_rate(-1)
