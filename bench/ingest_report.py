"""Figures of `python -m bench.ingest`: one `Phase` per wrk run, then min/median/max over runs,
ratios against the bare endpoint paired per run, the goals, and the final JSON line."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from bench.report import cell, rounded, spread
from bench.wrk_runner import WrkResult

GOAL_SINGLE_VS_BARE = 0.60
GOAL_BATCH_MSGS_PER_S = 30_000.0
GOAL_P99_VS_BARE = 3.0
GOAL_VALIDATED_VS_NOT = 0.85


@dataclass
class Phase:
    """One wrk run against one target."""

    run: int
    target: str  # "bare-1w", "receiver-2w"
    broker: str  # "" for the bare endpoint
    mode: str  # "single", "batch", or "half" (single messages at half the full-load rate)
    result: WrkResult
    messages_per_request: int
    offered_per_s: float | None = None
    settle_s: float = 0.0
    cpu_s: float = 0.0  # a receiver's CPU (workers and flush processes) until it flushed
    problems: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        return " ".join(p for p in (self.target, self.broker, self.mode) if p)

    @property
    def requests_per_s(self) -> float:
        return self.result.ok_requests / self.result.duration_s if self.result.duration_s else 0.0

    @property
    def messages_per_s(self) -> float:
        return self.requests_per_s * self.messages_per_request

    @property
    def p99_ms(self) -> float:
        return self.result.p99_ms

    @property
    def cpu_ms_per_msg(self) -> float:
        messages = self.result.ok_requests * self.messages_per_request
        return self.cpu_s * 1000 / messages if messages else math.nan

    def line(self) -> str:
        r = self.result
        text = (f"run {self.run} {self.key:<30} {self.messages_per_s:9.0f} msg/s "
                f"{self.requests_per_s:8.0f} req/s  p50 {r.p50_ms:6.1f}  p99 {r.p99_ms:7.1f} ms")
        notes = [f"{k} errors {v}" for k, v in r.errors.items() if v]
        if self.offered_per_s is not None:
            notes.append(f"offered {self.offered_per_s:.0f} req/s")
        if self.settle_s:
            notes.append(f"flushed in {self.settle_s:.1f} s")
        if self.cpu_s and self.result.ok_requests:
            notes.append(f"{self.cpu_ms_per_msg:.3f} CPU ms/msg")
        notes += self.problems
        return text + (f"  [{', '.join(notes)}]" if notes else "")


def _paired(phases: list[Phase], key: str, base_key: str, figure: str) -> list[float]:
    """Per run: figure of `key` ÷ figure of `base_key` (runs that have both)."""
    by_run = {(p.key, p.run): p for p in phases}
    ratios = []
    for run in sorted({p.run for p in phases}):
        a, b = by_run.get((key, run)), by_run.get((base_key, run))
        if a and b and getattr(b, figure):
            ratios.append(getattr(a, figure) / getattr(b, figure))
    return ratios


def _paired_totals(phases: list[Phase], key: str, base_key: str,
                   cpu: bool = False) -> list[float]:
    """Per run: req/s of all the `key` phases together ÷ req/s of all the `base_key` ones;
    with `cpu`, messages per CPU second instead of per second (what a receiver bound by its
    CPU would keep, whatever else the shared machine runs)."""
    ratios = []
    for run in sorted({p.run for p in phases}):
        rates = []
        for wanted in (key, base_key):
            rows = [p for p in phases if p.run == run and p.key == wanted]
            spent = sum(p.cpu_s if cpu else p.result.duration_s for p in rows)
            rates.append(sum(p.result.ok_requests for p in rows) / spent if spent else 0.0)
        if rates[0] and rates[1]:
            ratios.append(rates[0] / rates[1])
    return ratios


def summarize(phases: list[Phase], brokers: list[str]) -> dict[str, Any]:
    keys = list(dict.fromkeys(p.key for p in phases))
    figures = {}
    for key in keys:
        rows = [p for p in phases if p.key == key]
        figures[key] = {
            "messages_per_s": spread([p.messages_per_s for p in rows]),
            "requests_per_s": spread([p.requests_per_s for p in rows]),
            "p50_ms": spread([p.result.p50_ms for p in rows]),
            "p99_ms": spread([p.result.p99_ms for p in rows]),
            "errors": sum(p.result.failed for p in rows),
        }
    by_broker: dict[str, Any] = {}
    for broker in brokers:
        by_broker[broker] = {
            "single_vs_bare_1w": spread(_paired(phases, f"receiver-1w {broker} single",
                                                "bare-1w single", "requests_per_s")),
            "single_vs_bare_2w": spread(_paired(phases, f"receiver-2w {broker} single",
                                                "bare-2w single", "requests_per_s")),
            "batch_msgs_per_s_1w": figures.get(f"receiver-1w {broker} batch",
                                               {}).get("messages_per_s", spread([])),
            "batch_msgs_per_s_2w": figures.get(f"receiver-2w {broker} batch",
                                               {}).get("messages_per_s", spread([])),
            "p99_half_load_vs_bare": spread(_paired(phases, f"receiver-1w {broker} half",
                                                    "bare-1w half", "p99_ms")),
        }
    # headline figures: the worse broker's median, so that a goal counts as met for both
    medians = {name: [by_broker[b][name]["median"] for b in brokers] for name in
               ("single_vs_bare_1w", "batch_msgs_per_s_2w", "p99_half_load_vs_bare")}
    # the payload schema phase: 20-field messages with validation ÷ without, paired per run
    with_key, without_key = (f"receiver-1w {brokers[0]} fields20+schema",
                             f"receiver-1w {brokers[0]} fields20")
    validated = spread(_paired_totals(phases, with_key, without_key))
    validated_cpu = spread(_paired_totals(phases, with_key, without_key, cpu=True))
    headline = {
        "ratio_single_vs_bare": _worst(medians["single_vs_bare_1w"], min),
        "batch_msgs_per_s": _worst(medians["batch_msgs_per_s_2w"], min),
        "p99_ratio_vs_bare": _worst(medians["p99_half_load_vs_bare"], max),
        "ratio_validated_vs_not": validated["median"],
    }
    goals = {name: _goal(headline[name], bound, above) for name, bound, above in (
        ("ratio_single_vs_bare", GOAL_SINGLE_VS_BARE, True),
        ("batch_msgs_per_s", GOAL_BATCH_MSGS_PER_S, True),
        ("p99_ratio_vs_bare", GOAL_P99_VS_BARE, False),
        ("ratio_validated_vs_not", GOAL_VALIDATED_VS_NOT, True))}
    return {**headline, "goals": goals, "validated_vs_not": validated,
            "validated_vs_not_per_cpu_s": validated_cpu,
            "by_broker": by_broker, "figures": figures,
            "problems": [f"run {p.run} {p.key}: {m}" for p in phases for m in p.problems]}


def _goal(value: float, bound: float, above: bool) -> dict[str, Any]:
    """A goal and whether it was met; None when this run did not measure it."""
    met = None if math.isnan(value) else (value >= bound if above else value <= bound)
    return {"goal": f"{'>=' if above else '<='} {bound:g}", "met": met}


def _worst(values: list[float], pick: Any) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return float(pick(finite)) if finite else math.nan


def table(summary: dict[str, Any]) -> list[str]:
    head = (f"{'phase':<30} {'msg/s (min / median / max)':>28} {'p50 ms':>20}"
            f" {'p99 ms':>22} {'errors':>7}")
    lines = ["min / median / max over runs", head, "-" * len(head)]
    for key, f in summary["figures"].items():
        lines.append(f"{key:<30} {cell(f['messages_per_s'], '.0f'):>28}"
                     f" {cell(f['p50_ms'], '.1f'):>20} {cell(f['p99_ms'], '.1f'):>22}"
                     f" {f['errors']:>7}")
    lines += ["", "paired per run with the bare endpoint of the same run (min / median / max)",
              f"{'broker':<10} {'single ÷ bare, 1w':>22} {'single ÷ bare, 2w':>22}"
              f" {'batch msg/s, 2w':>26} {'p99 half-load ÷ bare':>24}"]
    for broker, b in summary["by_broker"].items():
        lines.append(f"{broker:<10} {cell(b['single_vs_bare_1w'], '.2f'):>22}"
                     f" {cell(b['single_vs_bare_2w'], '.2f'):>22}"
                     f" {cell(b['batch_msgs_per_s_2w'], '.0f'):>26}"
                     f" {cell(b['p99_half_load_vs_bare'], '.2f'):>24}")
    lines += ["", "payload schema phase, 20-field messages, receiver-1w, with validation ÷ "
                  "without, paired per run (min / median / max):",
              f"  msg/s                  {cell(summary['validated_vs_not'], '.3f')}",
              f"  msg per CPU second     {cell(summary['validated_vs_not_per_cpu_s'], '.3f')}",
              ""]
    for name, goal in summary["goals"].items():
        verdict = {True: "met", False: "MISSED", None: "not measured"}[goal["met"]]
        lines.append(f"goal {name} {goal['goal']}: {rounded(summary[name])} -> {verdict}")
    return lines
