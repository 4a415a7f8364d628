"""Nearest-rank percentiles, as the dashboard and the benchmarks report them."""

from __future__ import annotations

import math
from collections.abc import Sequence


def nearest_rank(ordered: Sequence[float], q: float) -> float:
    """The `q` quantile (0 < q <= 1) of an ascending, non-empty sequence: its smallest value
    with at least q of the values at or below it."""
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
