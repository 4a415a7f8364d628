"""The report's time axes fit the data's range: an hour in minutes, a day in hours, a week in
days, and a single point shown in a window around it (not on an axis of years)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

pd = pytest.importorskip("pandas")
charts = pytest.importorskip("analytics.charts")

T0 = datetime(2026, 3, 1, 10, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)


def hours(count: int) -> list[datetime]:
    return [T0 + i * HOUR for i in range(count)]


@pytest.mark.parametrize(("span", "unit", "interval"), [
    (3 * HOUR, "minute", 30),
    (timedelta(days=1), "hour", 3),
    (timedelta(weeks=1), "day", 1),
    (timedelta(days=90), "day", 14),
])
def test_time_axis_ticks_fit_the_range(span: timedelta, unit: str, interval: int) -> None:
    axis = charts.time_axis(T0, T0 + span, period_starts=hours(int(span / HOUR)))
    assert (axis.start, axis.end) == (T0, T0 + span)
    assert (axis.unit, axis.interval) == (unit, interval)


def test_time_axis_of_a_single_point_is_a_window_around_it() -> None:
    hourly = charts.time_axis(T0, T0 + HOUR, period_starts=[T0])  # one hour's value
    assert (hourly.start, hourly.end) == (T0 - HOUR, T0 + 2 * HOUR)  # its hour in the middle
    assert (hourly.range_start, hourly.range_end) == (T0, T0 + HOUR)  # shaded around
    assert (hourly.unit, hourly.interval) == ("minute", 30)
    instant = charts.time_axis(T0, T0, period=timedelta(0), period_starts=[T0])
    assert instant.start < T0 < instant.end and instant.end - instant.start == HOUR
    assert instant.unit == "minute"


def test_time_axis_covers_the_hours_a_range_starts_and_ends_in() -> None:
    start = T0 + timedelta(minutes=17)
    axis = charts.time_axis(start, start + HOUR, period_starts=[T0, T0 + HOUR])
    assert (axis.start, axis.end) == (T0 - HOUR / 2, T0 + 2.5 * HOUR)  # its two hours, middle
    assert axis.unit == "minute"
    minutes = charts.time_axis(T0, T0 + HOUR, period=timedelta(minutes=5),
                               period_starts=[T0 + i * timedelta(minutes=5) for i in range(12)])
    assert (minutes.start, minutes.end, minutes.unit, minutes.interval) == (
        T0, T0 + HOUR, "minute", 10)  # an hour: minutes


def _labels(svg_text: str) -> str:
    return " ".join(re.findall(r"<text[^>]*>([^<]*)</text>", svg_text))


def test_one_hour_of_data_draws_minutes_not_years() -> None:
    messages_in = pd.DataFrame({
        "level": ["destination"], "granularity": ["hour"],
        "period_start": pd.to_datetime([T0], utc=True), "destination": ["orders"],
        "subscription": [None], "messages": [120]})
    text = charts.svg(charts.messages_per_period(messages_in, "hour", start=T0,
                                                 end=T0 + HOUR))
    labels = _labels(text)
    assert "09:30" in labels and "11:30" in labels, labels
    assert not re.search(r"\b20(2[0-57-9]|3\d)\b", labels), labels  # only the data's year
    assert "<rect" in text  # the hour's bar is drawn


def test_a_week_of_hourly_values_draws_days() -> None:
    start = T0.replace(hour=0)
    table = pd.DataFrame({
        "level": "subscription", "granularity": "hour",
        "period_start": pd.to_datetime([start + i * HOUR for i in range(24 * 7)], utc=True),
        "destination": "orders", "subscription": "orders/billing",
        "success_rate": 0.99, "deliveries": 10})
    text = charts.svg(charts.hourly_series(table, "success_rate", "rate", weight="deliveries",
                                           start=start, end=start + timedelta(weeks=1)))
    labels = _labels(text)
    assert all(f"{day:02d}" in labels for day in range(2, 8)), labels
    assert "Mar" in labels, labels
