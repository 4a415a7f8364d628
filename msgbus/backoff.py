"""How long a loop that failed waits before it tries again: one rule for every reconnecting
consumer, publisher, flush loop and restarted process of the services. (The client library has
its own, with jitter, because it imports nothing from the services.)"""

from __future__ import annotations


def backoff_s(*, failures: int, first_s: float, max_s: float, factor: float = 2.0) -> float:
    """The wait after `failures` failures in a row: nothing before the first, `first_s` after
    it, `factor` times longer after each next one, never more than `max_s`."""
    if failures <= 0:
        return 0.0
    return min(max_s, first_s * factor ** min(failures - 1, 64))
