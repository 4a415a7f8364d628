"""The report's charts: matplotlib figures rendered to self-contained SVG text."""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import matplotlib

matplotlib.use("Agg")  # no display; must precede pyplot

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib import dates as mdates
from matplotlib.axes import Axes

MAX_SERIES = 8  # lines or bars beyond this make a chart unreadable: the busiest are kept
STATUS_COLORS = {"delivered": "#2e9d5b", "failed": "#d64545", "retrying": "#f0a030",
                 "pending": "#9aa5b1", "parked": "#7a3fa0", "skipped": "#c9d1d9",
                 "discarded": "#4a4a4a", "scheduled": "#4a90d9"}
_METADATA = re.compile(r"<metadata>.*?</metadata>\s*", re.DOTALL)  # RDF with a creation date
plt.rcParams.update({"font.size": 9, "axes.spines.top": False, "axes.spines.right": False,
                     "svg.fonttype": "none", "svg.hashsalt": "msgbus"})


HOUR = timedelta(hours=1)
MIN_WINDOW = HOUR  # a single point, or a shorter range, is shown in this much time around it
MIN_PERIODS = 3  # a chart of periods shows at least this many, so a lone one reads as one
OUTSIDE_RANGE = "#eef1f4"  # the shade of the window beyond the report's range: no data, not 0
MAX_TICKS = 8
# tick units, finest first, each with the intervals it may step by
_TICK_STEPS: tuple[tuple[str, timedelta, tuple[int, ...]], ...] = (
    ("minute", timedelta(minutes=1), (1, 2, 5, 10, 15, 20, 30)),
    ("hour", HOUR, (1, 2, 3, 4, 6, 12)),
    ("day", timedelta(days=1), (1, 2, 7, 14)),
    ("month", timedelta(days=30), (1, 2, 3, 6, 12)),
)


@dataclass(frozen=True)
class TimeAxis:
    """The x axis of a chart over time: the window it shows and the tick step."""

    start: datetime
    end: datetime
    unit: str  # minute | hour | day | month
    interval: int
    range_start: datetime | None = None  # the report's range, when the window is wider
    range_end: datetime | None = None

    def apply(self, axes: Axes) -> None:
        locators = {"minute": lambda: mdates.MinuteLocator(byminute=range(0, 60, self.interval)),
                    "hour": lambda: mdates.HourLocator(interval=self.interval),
                    "day": lambda: mdates.DayLocator(interval=self.interval),
                    "month": lambda: mdates.MonthLocator(interval=self.interval)}
        locator = locators[self.unit]()
        axes.xaxis.set_major_locator(locator)
        axes.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
        axes.set_xlim(self.start, self.end)  # type: ignore[arg-type]
        for low, high in ((self.start, self.range_start), (self.range_end, self.end)):
            if low is not None and high is not None and low < high:
                axes.axvspan(low, high, color=OUTSIDE_RANGE, zorder=0, lw=0)  # type: ignore[arg-type]
        axes.set_xlabel("UTC (shaded: outside the report's range)"
                        if self.range_start is not None else "UTC")


def time_axis(start: datetime, end: datetime, *, period: timedelta = HOUR,
              period_starts: Sequence[datetime] = ()) -> TimeAxis:
    """The report's range, widened to whole `period`s for the data's periods (each [t, t +
    period)), then to at least MIN_PERIODS periods and MIN_WINDOW around its middle (a lone
    value shows as one, not as the whole chart). Ticks: the finest unit and step that make at
    most MAX_TICKS of them (an hour: minutes, a day: hours, a week: days)."""
    low = min([start, *period_starts])
    high = max([end, *(moment + period for moment in period_starts)])
    shortest = max(MIN_WINDOW, MIN_PERIODS * period)
    if high - low < shortest:
        middle = low + (high - low) / 2
        low, high = middle - shortest / 2, middle + shortest / 2
    unit, interval = _ticks(high - low)
    if (low, high) == (start, end):
        return TimeAxis(low, high, unit, interval)
    return TimeAxis(low, high, unit, interval, range_start=start, range_end=end)


def _ticks(span: timedelta) -> tuple[str, int]:
    for unit, size, intervals in _TICK_STEPS:
        for interval in intervals:
            if span / (size * interval) <= MAX_TICKS:
                return unit, interval
    return "month", 12 * max(1, round(span / timedelta(days=365 * MAX_TICKS)))


def svg(draw: Callable[[Axes], None], *, width_in: float = 7.5, height_in: float = 3.0) -> str:
    figure, axes = plt.subplots(figsize=(width_in, height_in))
    try:
        draw(axes)
        figure.tight_layout()
        buffer = io.StringIO()
        figure.savefig(buffer, format="svg")
    finally:
        plt.close(figure)
    text = buffer.getvalue()
    text = text[text.index("<svg"):]  # drop the XML prologue: the SVG goes inline in HTML
    return _METADATA.sub("", text)


def _no_data(axes: Axes) -> None:
    axes.text(0.5, 0.5, "no data in this range", ha="center", va="center",
              transform=axes.transAxes, color="#666")
    axes.set_axis_off()


def messages_per_period(messages_in: pd.DataFrame, granularity: str, *, start: datetime,
                        end: datetime) -> Callable[[Axes], None]:
    rows = messages_in[(messages_in["level"] == "destination")
                       & (messages_in["granularity"] == granularity)]
    period = HOUR if granularity == "hour" else timedelta(days=1)

    def draw(axes: Axes) -> None:
        if rows.empty:
            return _no_data(axes)
        table = rows.pivot_table(index="period_start", columns="destination", values="messages",
                                 aggfunc="sum", fill_value=0)
        table = table[table.sum().sort_values(ascending=False).index[:MAX_SERIES]]
        axis = time_axis(start, end, period=period, period_starts=list(table.index))
        # each bar over the middle of its period, no thinner than an 80th of the window (a
        # lone hour in a week stays visible) unless that would overlap its neighbour
        gaps = table.index.to_series().diff().dropna()
        widest = 0.8 * gaps.min() if not gaps.empty else axis.end - axis.start
        width = min(max(0.8 * period, (axis.end - axis.start) / 80), widest)
        width_days = width / timedelta(days=1)
        middles = table.index + period / 2
        bottom = None
        for destination in table.columns:
            axes.bar(middles, table[destination], width=width_days, bottom=bottom,
                     label=destination)
            bottom = table[destination] if bottom is None else bottom + table[destination]
        axis.apply(axes)
        axes.set_ylabel(f"messages per {granularity}")
        axes.legend(fontsize=7, ncols=2, frameon=False)
        return None

    return draw


def outcomes_by_subscription(deliveries: pd.DataFrame, statuses: tuple[str, ...]
                             ) -> Callable[[Axes], None]:
    rows = deliveries[(deliveries["level"] == "subscription")
                      & (deliveries["granularity"] == "total")]
    rows = rows.sort_values("deliveries", ascending=False).head(2 * MAX_SERIES)

    def draw(axes: Axes) -> None:
        if rows.empty:
            return _no_data(axes)
        left = pd.Series(0, index=rows.index, dtype="float64")
        for status in statuses:
            if rows[status].sum() == 0:
                continue
            axes.barh(rows["subscription"], rows[status], left=left, label=status,
                      color=STATUS_COLORS.get(status))
            left = left + rows[status]
        axes.invert_yaxis()
        axes.set_xlabel("deliveries")
        axes.legend(fontsize=7, ncols=4, frameon=False, loc="lower right")
        return None

    return draw


def latency_by_subscription(pushes: pd.DataFrame) -> Callable[[Axes], None]:
    rows = pushes[(pushes["level"] == "subscription") & (pushes["granularity"] == "total")]
    rows = rows.sort_values("latency_ms_p95", ascending=False).head(2 * MAX_SERIES)

    def draw(axes: Axes) -> None:
        if rows.empty:
            return _no_data(axes)
        positions = range(len(rows))
        for offset, (column, label) in enumerate((("latency_ms_p50", "p50"),
                                                  ("latency_ms_p95", "p95"),
                                                  ("latency_ms_p99", "p99"))):
            axes.barh([p + (offset - 1) * 0.27 for p in positions], rows[column], height=0.27,
                      label=label)
        axes.set_yticks(list(positions), list(rows["subscription"]))
        axes.invert_yaxis()
        axes.set_xscale("log")
        axes.set_xlabel("push latency, ms (log scale)")
        axes.legend(fontsize=7, frameon=False)
        return None

    return draw


def hourly_series(table: pd.DataFrame, column: str, label: str, *, weight: str,
                  start: datetime, end: datetime) -> Callable[[Axes], None]:
    """`column` per hour, one line per subscription (the `weight`-iest ones), each value in the
    middle of its hour."""
    rows = table[(table["level"] == "subscription") & (table["granularity"] == "hour")]

    def draw(axes: Axes) -> None:
        if rows.empty or rows[column].isna().all():
            return _no_data(axes)
        busiest = (rows.groupby("subscription")[weight].sum().sort_values(ascending=False)
                   .index[:MAX_SERIES])
        for subscription in busiest:
            series = rows[rows["subscription"] == subscription].sort_values("period_start")
            few = len(series) <= 48  # few points: each one visible, a lone one too
            axes.plot(series["period_start"] + HOUR / 2, series[column],
                      marker="o" if few else ".", markersize=5 if few else 3, label=subscription)
        time_axis(start, end, period_starts=list(rows["period_start"])).apply(axes)
        axes.set_ylabel(label)
        axes.legend(fontsize=7, ncols=2, frameon=False)
        return None

    return draw


def attempts_histogram(attempts_until_success: pd.DataFrame) -> Callable[[Axes], None]:
    def draw(axes: Axes) -> None:
        if attempts_until_success.empty:
            return _no_data(axes)
        counts = attempts_until_success.groupby("attempts")["deliveries"].sum().sort_index()
        axes.bar(counts.index.astype(str), counts.values, color="#3b6fb6")
        axes.set_yscale("log")
        axes.set_xlabel("attempts until success")
        axes.set_ylabel("delivered (log scale)")
        return None

    return draw
