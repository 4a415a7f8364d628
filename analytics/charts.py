"""The report's charts: matplotlib figures rendered to self-contained SVG text."""

from __future__ import annotations

import io
import re
from collections.abc import Callable

import matplotlib

matplotlib.use("Agg")  # no display; must precede pyplot

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.axes import Axes

MAX_SERIES = 8  # lines or bars beyond this make a chart unreadable: the busiest are kept
STATUS_COLORS = {"delivered": "#2e9d5b", "failed": "#d64545", "retrying": "#f0a030",
                 "pending": "#9aa5b1", "parked": "#7a3fa0", "skipped": "#c9d1d9",
                 "discarded": "#4a4a4a", "scheduled": "#4a90d9"}
_METADATA = re.compile(r"<metadata>.*?</metadata>\s*", re.DOTALL)  # RDF with a creation date
plt.rcParams.update({"font.size": 9, "axes.spines.top": False, "axes.spines.right": False,
                     "svg.fonttype": "none", "svg.hashsalt": "msgbus"})


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


def messages_per_period(messages_in: pd.DataFrame, granularity: str) -> Callable[[Axes], None]:
    rows = messages_in[(messages_in["level"] == "destination")
                       & (messages_in["granularity"] == granularity)]

    def draw(axes: Axes) -> None:
        if rows.empty:
            return _no_data(axes)
        table = rows.pivot_table(index="period_start", columns="destination", values="messages",
                                 aggfunc="sum", fill_value=0)
        table = table[table.sum().sort_values(ascending=False).index[:MAX_SERIES]]
        bottom = None
        width = 0.03 if granularity == "hour" else 0.8
        for destination in table.columns:
            axes.bar(table.index, table[destination], width=width, bottom=bottom,
                     label=destination)
            bottom = table[destination] if bottom is None else bottom + table[destination]
        axes.set_ylabel(f"messages per {granularity}")
        axes.legend(fontsize=7, ncols=2, frameon=False)
        axes.figure.autofmt_xdate()
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


def hourly_series(table: pd.DataFrame, column: str, label: str, *, weight: str
                  ) -> Callable[[Axes], None]:
    """`column` per hour, one line per subscription (the `weight`-iest ones)."""
    rows = table[(table["level"] == "subscription") & (table["granularity"] == "hour")]

    def draw(axes: Axes) -> None:
        if rows.empty or rows[column].isna().all():
            return _no_data(axes)
        busiest = (rows.groupby("subscription")[weight].sum().sort_values(ascending=False)
                   .index[:MAX_SERIES])
        for subscription in busiest:
            series = rows[rows["subscription"] == subscription].sort_values("period_start")
            axes.plot(series["period_start"], series[column], marker=".", label=subscription)
        axes.set_ylabel(label)
        axes.legend(fontsize=7, ncols=2, frameon=False)
        axes.figure.autofmt_xdate()
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
