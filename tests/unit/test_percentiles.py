"""The nearest-rank percentiles the dashboard, the benchmarks and the test kit print."""

import math

from msgbus.percentiles import nearest_rank


def test_a_percentile_is_the_smallest_value_with_that_share_at_or_below_it() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert nearest_rank(values, 0.50) == 50.0
    assert nearest_rank(values, 0.99) == 99.0
    assert nearest_rank(values, 1.0) == 100.0
    assert nearest_rank([7.0], 0.5) == nearest_rank([7.0], 0.99) == 7.0
    assert nearest_rank([1.0, 2.0], 0.5) == 1.0  # no interpolation


def test_values_in_any_order_and_none_at_all() -> None:
    assert nearest_rank([3.0, 1.0, 2.0], 0.5) == 2.0
    assert nearest_rank((v for v in [5.0, 4.0]), 1.0) == 5.0
    assert math.isnan(nearest_rank([], 0.5))
    assert nearest_rank([], 0.5, empty=0.0) == 0.0
