"""Figures of the pipeline benchmark: one `Phase` per (run, target), the summary table with
min/median/max over runs, ratios against the direct-HTTP baseline of the same run, and the
final JSON line."""

from __future__ import annotations

import math
import statistics
import sys
from dataclasses import dataclass, field
from typing import Any

from msgbus.percentiles import nearest_rank

BASELINE = "direct-http"
FIGURES = ("accepted_per_s", "delivered_per_s", "p50_ms", "p95_ms", "p99_ms")


def say(message: str) -> None:
    """Progress, on stderr, so that stdout keeps only the results."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def out(message: str = "") -> None:
    print(message, flush=True)


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile of `values` (nan when empty)."""
    return nearest_rank(sorted(values), p / 100) if values else math.nan


@dataclass
class Phase:
    """One batch of N messages to one target: the producer's view and the subscriber's."""

    target: str
    run: int
    messages: int
    accepted: int
    failed: int
    not_sent: int
    retries: int
    accept_s: float
    first_sent: float
    delivered: int
    duplicates: int
    last_arrival: float
    latencies_ms: list[float] = field(repr=False)
    settle_s: float = 0.0
    problems: dict[str, int] = field(default_factory=dict)

    @property
    def missing(self) -> int:
        return self.messages - self.delivered

    @property
    def accepted_per_s(self) -> float:
        return self.accepted / self.accept_s if self.accept_s > 0 else math.nan

    @property
    def delivered_per_s(self) -> float:
        span = self.last_arrival - self.first_sent
        return self.delivered / span if self.delivered and span > 0 else math.nan

    @property
    def p50_ms(self) -> float:
        return percentile(self.latencies_ms, 50)

    @property
    def p95_ms(self) -> float:
        return percentile(self.latencies_ms, 95)

    @property
    def p99_ms(self) -> float:
        return percentile(self.latencies_ms, 99)

    def line(self) -> str:
        text = (f"run {self.run} {self.target:<11} accepted {self.accepted_per_s:8.0f} msg/s"
                f"  delivered {self.delivered_per_s:8.0f} msg/s  latency p50 {self.p50_ms:7.1f}"
                f"  p95 {self.p95_ms:7.1f}  p99 {self.p99_ms:7.1f} ms")
        notes = []
        if self.missing:
            notes.append(f"MISSING {self.missing}")
        for name in ("failed", "not_sent", "retries", "duplicates"):
            if getattr(self, name):
                notes.append(f"{name} {getattr(self, name)}")
        if self.problems:
            notes.append(f"problems {self.problems}")
        if self.target != BASELINE:
            notes.append(f"trace settled in {self.settle_s:.1f} s")
        return text + ("  [" + ", ".join(notes) + "]" if notes else "")


def spread(values: list[float]) -> dict[str, float]:
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return {"min": math.nan, "median": math.nan, "max": math.nan}
    return {"min": min(finite), "median": statistics.median(finite), "max": max(finite)}


def cell(s: dict[str, float], fmt: str) -> str:
    """A spread as "min / median / max"."""
    return " / ".join(format(s[k], fmt) for k in ("min", "median", "max"))


def summarize(phases: list[Phase], targets: list[str]) -> dict[str, Any]:
    by_target = {t: [p for p in phases if p.target == t] for t in targets}
    summary: dict[str, Any] = {"targets": {}, "vs_baseline": {}}
    for target, rows in by_target.items():
        summary["targets"][target] = {f: spread([getattr(p, f) for p in rows]) for f in FIGURES}
        summary["targets"][target]["missing"] = sum(p.missing for p in rows)
        summary["targets"][target]["duplicates"] = sum(p.duplicates for p in rows)
    baseline = {p.run: p for p in by_target.get(BASELINE, [])}
    for target, rows in by_target.items():
        paired = [(p, baseline[p.run]) for p in rows if target != BASELINE and p.run in baseline]
        if paired:
            summary["vs_baseline"][target] = {
                "delivered_ratio": spread([p.delivered_per_s / b.delivered_per_s
                                           for p, b in paired]),
                "p50_overhead_ms": spread([p.p50_ms - b.p50_ms for p, b in paired]),
            }
    return summary


def table(summary: dict[str, Any]) -> list[str]:
    head = (f"{'target':<12} {'accepted msg/s':>22} {'delivered msg/s':>22} {'p50 ms':>25}"
            f" {'p95 ms':>26} {'p99 ms':>26} {'missing':>8}")
    lines = ["min / median / max over runs", head, "-" * len(head)]
    for target, s in summary["targets"].items():
        lines.append(
            f"{target:<12} {cell(s['accepted_per_s'], '.0f'):>22}"
            f" {cell(s['delivered_per_s'], '.0f'):>22} {cell(s['p50_ms'], '.1f'):>25}"
            f" {cell(s['p95_ms'], '.1f'):>26} {cell(s['p99_ms'], '.1f'):>26}"
            f" {s['missing']:>8}")
    if summary["vs_baseline"]:
        lines += ["", f"vs the {BASELINE} baseline of the same run (min / median / max)",
                  f"{'broker':<12} {'delivered ÷ baseline':>24} {'p50 overhead ms':>26}"]
        for target, s in summary["vs_baseline"].items():
            lines.append(f"{target:<12} {cell(s['delivered_ratio'], '.3f'):>24}"
                         f" {cell(s['p50_overhead_ms'], '+.1f'):>26}")
    return lines


def rounded(value: Any) -> Any:
    """Round floats in nested dicts for the JSON line; nan becomes None."""
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, 3 if abs(value) < 10 else 1)
    return value
