"""How a subscription is doing, for its page: pushes by outcome, p50/p99 latency, backlog and the
oldest undelivered age over the last hour, day or week (from `msgbus/store/pushstats.py`'s
buckets), its newest failed pushes, and its backlog now. Charts are drawn on the server as SVG:
each is a list of bars or polylines in a fixed view box, each bar titled with its figure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from fastapi import APIRouter

from admin.access import ReadsSubscription
from admin.dashboard import COUNT_CAP
from admin.deps import Store
from admin.params import DestinationCode, SubscriptionName
from msgbus.models import DeliveryStatus, subscription_id, utcnow
from msgbus.store import MongoStore
from msgbus.store.pushstats import UNITS, Bucket, bucket_start, series

# range name -> (bucket unit, number of buckets)
RANGES: dict[str, tuple[str, int]] = {"hour": ("minute", 60), "day": ("hour", 24),
                                      "week": ("hour", 168)}
WIDTH, HEIGHT = 600.0, 80.0
FAILURES_SHOWN = 20


@dataclass(slots=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    kind: str  # a CSS class: ok, failed, error, backlog
    label: str  # its <title>


@dataclass(slots=True)
class Chart:
    title: str
    bars: list[Bar]
    lines: dict[str, list[tuple[float, float]]]  # CSS class -> the points of a polyline
    peak: float
    unit: str  # of the figures: "pushes", "ms", "messages", "s"

    @property
    def summary(self) -> str:
        return f"{self.title}: peak {self.peak:g} {self.unit}"

    @property
    def view_box(self) -> str:
        return f"0 0 {WIDTH:g} {HEIGHT:g}"


@dataclass(slots=True)
class SubscriptionHealth:
    range: str
    buckets: list[Bucket]
    charts: list[Chart]
    failures: list[dict[str, object]]
    backlog: int
    oldest_age_s: float
    parked: int

    @property
    def pushes(self) -> int:
        return sum(b.pushes for b in self.buckets)

    @property
    def success_rate(self) -> float | None:
        return sum(b.ok for b in self.buckets) / self.pushes if self.pushes else None


async def subscription_health(store: MongoStore, sub_id: str, range_name: str
                              ) -> SubscriptionHealth:
    unit, points = RANGES.get(range_name, RANGES["hour"])
    now = utcnow()
    first = bucket_start(now, unit) - (points - 1) * UNITS[unit]
    buckets = series(await store.figures.push_stats_since(sub_id, unit, first), first, unit, points)
    backlog, oldest = await store.progress.backlog(sub_id, COUNT_CAP)
    parked = await store.progress.count_deliveries(sub_id, DeliveryStatus.PARKED)
    return SubscriptionHealth(
        range=range_name if range_name in RANGES else "hour", buckets=buckets,
        charts=charts(buckets, unit),
        failures=await store.figures.latest_push_failures(sub_id, FAILURES_SHOWN),
        backlog=backlog, parked=parked,
        oldest_age_s=0.0 if oldest is None else max(0.0, (now - oldest).total_seconds()))


def charts(buckets: list[Bucket], unit: str) -> list[Chart]:
    return [outcome_chart(buckets, unit), latency_chart(buckets, unit),
            level_chart(buckets, unit, "Backlog", "backlog", "messages"),
            level_chart(buckets, unit, "Oldest undelivered age", "oldest_age_s", "s")]


def _when(at: datetime, unit: str) -> str:
    return at.strftime("%H:%M" if unit == "minute" else "%a %H:00")


def outcome_chart(buckets: list[Bucket], unit: str) -> Chart:
    """Stacked bars: delivered at the bottom, then answered with an error, then no answer."""
    peak = max((b.pushes for b in buckets), default=0)
    step = _step(buckets)
    bars = []
    for index, bucket in enumerate(buckets):
        base = HEIGHT
        for kind in ("ok", "failed", "error"):
            count = getattr(bucket, kind)
            if not count:
                continue
            height = _height(count, peak)
            base -= height
            bars.append(Bar(index * step, base, max(step - 1, 0.5), height, kind,
                            f"{_when(bucket.at, unit)} UTC: {count} {kind}"))
    return Chart("Pushes by outcome", bars, {}, peak, "pushes")


def latency_chart(buckets: list[Bucket], unit: str) -> Chart:
    """p50 and p99 as two polylines; a bucket without pushes leaves a gap in neither (skipped)."""
    figures = {"p50": [b.percentile_ms(0.50) for b in buckets],
               "p99": [b.percentile_ms(0.99) for b in buckets]}
    peak = max((v for values in figures.values() for v in values if v is not None), default=0.0)
    return Chart("Push latency p50 / p99 (upper bound of its histogram bucket)", [],
                 {name: _points(values, peak) for name, values in figures.items()}, peak, "ms")


def level_chart(buckets: list[Bucket], unit: str, title: str, field: str, unit_name: str
                ) -> Chart:
    """Bars of a sampled level (backlog, oldest age); a bucket without a sample has none."""
    values = [getattr(b, field) for b in buckets]
    peak = max((v for v in values if v is not None), default=0)
    step = _step(buckets)
    bars = [Bar(index * step, HEIGHT - _height(value, peak), max(step - 1, 0.5),
                _height(value, peak), field,
                f"{_when(buckets[index].at, unit)} UTC: {value:g} {unit_name}")
            for index, value in enumerate(values) if value]
    return Chart(title, bars, {}, peak, unit_name)


def _step(items: Sequence[object]) -> float:
    """The width each bucket takes in the view box."""
    return WIDTH / max(1, len(items))


def _height(value: float, peak: float) -> float:
    """A bar's height: the peak fills the view box but for a 2-unit margin."""
    return value / (peak or 1) * (HEIGHT - 2)


def _points(values: list[float | None], peak: float) -> list[tuple[float, float]]:
    step = _step(values)
    return [(round(index * step + step / 2, 1), round(HEIGHT - v / (peak or 1) * (HEIGHT - 4), 1))
            for index, v in enumerate(values) if v is not None]


router = APIRouter()


@router.get("/v1/destinations/{code}/subscriptions/{name}/health")
async def get_health(code: DestinationCode, name: SubscriptionName, _: ReadsSubscription,
                     store: Store,
                     range: Literal["hour", "day", "week"] = "hour") -> dict[str, Any]:
    """Its pushes by outcome, p50/p99 and backlog per minute (range=hour) or per hour (day,
    week), its newest failed pushes, and its backlog now."""
    sub = await store.config.get_subscription(subscription_id(code, name))
    health = await subscription_health(store, sub.id, range)
    return {
        "subscription": sub.id, "range": health.range, "unit": RANGES[health.range][0],
        "backlog": health.backlog, "oldest_age_s": round(health.oldest_age_s, 1),
        "parked": health.parked, "pushes": health.pushes, "success_rate": health.success_rate,
        "buckets": [{"at": b.at, "ok": b.ok, "failed": b.failed, "error": b.error,
                     "p50_ms": b.percentile_ms(0.5), "p99_ms": b.percentile_ms(0.99),
                     "backlog": b.backlog, "oldest_age_s": b.oldest_age_s}
                    for b in health.buckets],
        "failures": health.failures}
