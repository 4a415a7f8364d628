"""The statistics as one self-contained HTML page: figures first, charts (inline SVG, their time
axes fitted to the report's range), then the rankings and the per-subscription table, each
table scrolling sideways inside its card rather than running off the page. No script, no
external file."""

from __future__ import annotations

import html
import math
from datetime import datetime
from pathlib import Path

import pandas as pd

from analytics import charts
from analytics.stats import STATUSES, StatsTables

_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1100px;
       color: #1f2328; padding: 0 16px; }
h1 { font-size: 22px; margin-bottom: 2px; } h2 { font-size: 17px; margin-top: 32px; }
.sub { color: #59636e; margin-top: 0; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; margin: 16px 0; }
.card { border: 1px solid #d1d9e0; border-radius: 8px; padding: 10px 14px; min-width: 140px; }
.card b { display: block; font-size: 20px; } .card span { color: #59636e; font-size: 12px; }
.charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(480px, 1fr)); gap: 16px; }
figure { margin: 0; border: 1px solid #d1d9e0; border-radius: 8px; padding: 8px; }
figure svg { width: 100%; height: auto; } figcaption { font-weight: 600; margin: 4px 6px; }
.table-card { overflow-x: auto; max-width: 100%; border: 1px solid #d1d9e0;
              border-radius: 8px; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { border-bottom: 1px solid #e5e9ed; padding: 4px 8px; text-align: right; }
td { white-space: nowrap; } th { vertical-align: bottom; }
th:first-child, td:first-child, th:nth-child(2), td:nth-child(2) { text-align: left; }
td:first-child, td:nth-child(2) { white-space: normal; overflow-wrap: anywhere;
                                  min-width: 8em; }
th { background: #f6f8fa; } .bad { color: #b42318; font-weight: 600; }
"""


def render_report(tables: StatsTables, start: datetime, end: datetime, source: str) -> str:
    bus = _bus_totals(tables)
    figures = [
        ("Messages in per hour, by destination",
         charts.messages_per_period(tables.messages_in, "hour", start=start, end=end)),
        ("Deliveries by outcome, per subscription",
         charts.outcomes_by_subscription(tables.deliveries, STATUSES)),
        ("Push latency p50 / p95 / p99, per subscription",
         charts.latency_by_subscription(tables.pushes)),
        ("Push latency p95 per hour", charts.hourly_series(
            tables.pushes, "latency_ms_p95", "p95 ms", weight="attempts", start=start,
            end=end)),
        ("Delivery success rate per hour", charts.hourly_series(
            tables.deliveries, "success_rate", "delivered / deliveries", weight="deliveries",
            start=start, end=end)),
        ("Attempts until success", charts.attempts_histogram(tables.attempts_until_success)),
    ]
    chart_html = "\n".join(
        f"<figure><figcaption>{html.escape(title)}</figcaption>{charts.svg(draw)}</figure>"
        for title, draw in figures)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>msgbus delivery statistics</title>
<style>{_STYLE}</style></head><body>
<h1>msgbus delivery statistics</h1>
<p class="sub">{_when(start)} → {_when(end)} · source: {html.escape(source)}</p>
<div class="cards">{"".join(_card(label, value) for label, value in bus)}</div>
<div class="charts">{chart_html}</div>
<h2>Slowest subscribers (push latency)</h2>
{_table(tables.slowest_subscribers, "slowest")}
<h2>Most failing subscribers</h2>
{_table(tables.most_failing_subscribers, "failing")}
<h2>Subscriptions over the whole range</h2>
{_table(_subscription_summary(tables), "subscriptions")}
</body></html>
"""


def write_report(path: Path, tables: StatsTables, start: datetime, end: datetime,
                 source: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_report(tables, start, end, source), encoding="utf-8")
    return path


def _bus_totals(tables: StatsTables) -> list[tuple[str, str]]:
    def total(table: pd.DataFrame, column: str) -> float | None:
        rows = table[(table["level"] == "bus") & (table["granularity"] == "total")]
        if rows.empty:
            return None
        value = rows.iloc[0][column]
        return None if value is None or (isinstance(value, float) and math.isnan(value)) \
            else float(value)

    return [
        ("messages in", _number(total(tables.messages_in, "messages"))),
        ("deliveries", _number(total(tables.deliveries, "deliveries"))),
        ("delivered", _percent(total(tables.deliveries, "success_rate"))),
        ("pushes", _number(total(tables.pushes, "attempts"))),
        ("failed pushes", _number(total(tables.pushes, "failed_attempts"))),
        ("push latency p95", _ms(total(tables.pushes, "latency_ms_p95"))),
        ("accepted → delivered p95", _ms(total(tables.deliveries, "delivery_ms_p95"))),
    ]


def _subscription_summary(tables: StatsTables) -> pd.DataFrame:
    keys = ["destination", "subscription"]
    deliveries = tables.deliveries[(tables.deliveries["level"] == "subscription")
                                   & (tables.deliveries["granularity"] == "total")]
    pushes = tables.pushes[(tables.pushes["level"] == "subscription")
                           & (tables.pushes["granularity"] == "total")]
    # statuses no subscription had in the range would only widen the table
    present = [status for status in STATUSES if deliveries[status].fillna(0).sum() > 0]
    columns = [*keys, "deliveries", *present, "success_rate", "delivery_ms_p95"]
    merged = deliveries[columns].merge(
        pushes[[*keys, "attempts", "failed_attempts", "latency_ms_p50", "latency_ms_p95",
                "latency_ms_p99"]], on=keys, how="outer")
    return merged.sort_values(keys).reset_index(drop=True)


def _table(frame: pd.DataFrame, name: str) -> str:
    if frame.empty:
        return f'<p class="sub" id="{name}">none in this range</p>'
    head = "".join(f"<th>{html.escape(c.replace('_', ' '))}</th>" for c in frame.columns)
    body = "".join(
        "<tr>" + "".join(_cell(column, value) for column, value in row.items()) + "</tr>"
        for _, row in frame.iterrows())
    return (f'<div class="table-card"><table id="{name}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{body}</tbody></table></div>')


def _cell(column: str, value: object) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "<td>-</td>"
    if column.endswith("_rate") and isinstance(value, float):
        css = ' class="bad"' if value < 0.99 else ""
        return f"<td{css}>{_percent(value)}</td>"
    if "_ms" in column and isinstance(value, float):
        return f"<td>{_ms(value)}</td>"
    if isinstance(value, float) and value.is_integer():
        return f"<td>{int(value):,}</td>"
    if isinstance(value, int):
        return f"<td>{value:,}</td>"
    return f"<td>{html.escape(str(value))}</td>"


def _card(label: str, value: str) -> str:
    return f'<div class="card"><b>{html.escape(value)}</b><span>{html.escape(label)}</span></div>'


def _number(value: float | None) -> str:
    return "-" if value is None else f"{int(value):,}"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f} %"


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1000:.2f} s" if value >= 10_000 else f"{value:.1f} ms"


def _when(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M UTC")
