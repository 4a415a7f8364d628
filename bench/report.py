"""Figures of the pipeline benchmark: one `Phase` per (run, target), the summary table with
min/median/max over runs, ratios against the direct-HTTP baseline of the same run, and the
final JSON line.

And what every benchmark's report uses: progress on stderr (`say`), results on stdout (`out`,
`out_lines`, `out_json`), min / median / max spreads (`spread`, `cell`), figures of a run's
dataclass declared as a percentile of its samples (`percentile_of`, with the repository's one
percentile function, `msgbus.percentiles.nearest_rank`, which the benchmarks call directly too)
or a ratio of two of its figures (`ratio_of`), and floats rounded for the JSON line
(`rounded`)."""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, overload

from msgbus.percentiles import nearest_rank

BASELINE = "direct-http"
FIGURES = ("accepted_per_s", "delivered_per_s", "p50_ms", "p95_ms", "p99_ms")


def say(message: str) -> None:
    """Progress, on stderr, so that stdout keeps only the results."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def out(message: str = "") -> None:
    print(message, flush=True)


def out_lines(lines: Iterable[str]) -> None:
    """A blank line, then `lines` (a results table) on stdout."""
    out()
    for line in lines:
        out(line)


def out_json(figures: dict[str, Any]) -> None:
    """The benchmark's last line: its figures as one compact JSON object, floats `rounded`."""
    out(json.dumps(rounded(figures), separators=(",", ":")))


class Figure:
    """A figure of a run's dataclass computed from its other figures, read like a property (and,
    unlike a field, left out of `dataclasses.asdict`): made by `percentile_of` or `ratio_of`."""

    def __init__(self, compute: Callable[[Any], float]) -> None:
        self.compute = compute

    @overload
    def __get__(self, run: None, owner: type | None = None) -> Figure: ...
    @overload
    def __get__(self, run: object, owner: type | None = None) -> float: ...
    def __get__(self, run: object | None, owner: type | None = None) -> Figure | float:
        return self if run is None else self.compute(run)


def percentile_of(samples: str, q: float) -> Figure:
    """The `q` quantile of the run's list `samples` (`nearest_rank`; nan when empty)."""
    return Figure(lambda run: nearest_rank(getattr(run, samples), q))


def ratio_of(numerator: str, denominator: str) -> Figure:
    """The run's figure `numerator` ÷ its figure `denominator`."""
    return Figure(lambda run: float(getattr(run, numerator) / getattr(run, denominator)))


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

    p50_ms = percentile_of("latencies_ms", 0.50)
    p95_ms = percentile_of("latencies_ms", 0.95)
    p99_ms = percentile_of("latencies_ms", 0.99)

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
    """Round floats, also in nested dicts and lists, for the JSON line: 3 decimals below 10,
    else 1; nan and infinities become None."""
    if isinstance(value, float):
        return round(value, 3 if abs(value) < 10 else 1) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    return [rounded(v) for v in value] if isinstance(value, list) else value
