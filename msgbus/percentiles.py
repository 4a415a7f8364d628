"""The one percentile function of the repository: the dashboard's (admin), the benchmarks' and
the test kit's figures all come from `nearest_rank`."""

from __future__ import annotations

import math
from collections.abc import Iterable


def nearest_rank(values: Iterable[float], q: float, empty: float = math.nan) -> float:
    """The nearest-rank `q` quantile (0 < q <= 1) of `values`, in any order: sorted ascending,
    the value at (1-based) rank ceil(q * n), i.e. the smallest value with at least a share q of
    the values at or below it; no interpolation (p50 of [1, 2] is 1, p100 the maximum).
    `empty` (nan unless given) when there are no values."""
    ordered = sorted(values)
    if not ordered:
        return empty
    return ordered[min(len(ordered), max(1, math.ceil(q * len(ordered)))) - 1]
