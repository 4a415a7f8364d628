"""The dashboard's push figures: success rate and nearest-rank p50/p99 of the sampled attempts."""

from __future__ import annotations

from admin.dashboard import PushHealth


def test_admin_dashboard_push_health_of_no_attempts_has_no_rate() -> None:
    health = PushHealth.of([])
    assert health.attempts == 0 and health.success_rate is None and health.p99_ms is None


def test_admin_dashboard_push_health_rate_and_percentiles() -> None:
    samples = [(n % 10 != 0, float(n)) for n in range(1, 101)]  # latencies 1..100 ms, 10 failed
    health = PushHealth.of(samples)
    assert health.attempts == 100 and health.succeeded == 90
    assert health.success_rate == 0.9
    assert (health.p50_ms, health.p99_ms) == (50.0, 99.0)


def test_admin_dashboard_push_health_of_one_attempt() -> None:
    health = PushHealth.of([(True, 12.5)])
    assert (health.success_rate, health.p50_ms, health.p99_ms) == (1.0, 12.5, 12.5)
