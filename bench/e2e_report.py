"""Figures of `python -m bench.e2e`: one `E2ERun` per run, min/median/max over runs, the goals,
the final JSON object and the PNG plot of latency over time."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.report import cell, ratio_of, spread
from msgbus.percentiles import nearest_rank

GOAL_MSGS_PER_S = 2000.0  # sustained end to end through Kafka, with MongoDB records
GOAL_OVERHEAD_P50_MS = 20.0
GOAL_ISOLATION_RATIO = 0.9
# stopping MongoDB frees CPU; it must not cost latency (issue 37)
GOAL_MONGO_STOPPED_RATIO = 1.0
AT_MOST = ("overhead_p50_ms", "mongo_stopped_overhead_ratio")  # goals met at or below


@dataclass
class Capacity:
    """One broker's saturation phase: the client offered more than the bus can carry."""

    messages: int
    send_per_s: float  # send() returns per second (durable in the client's spool)
    accepted_per_s: float  # until the client's spool was empty: every message took a 202
    delivered_per_s: float  # (messages) ÷ (last arrival - first send)
    # (messages) ÷ (time until MongoDB holds every message and delivery state - first send)
    recorded_per_s: float
    cpu_cores: dict[str, float]  # CPU seconds per wall second of each process, by role
    latencies_ms: list[float] = field(repr=False)


@dataclass
class E2ERun:
    run: int
    capacity: dict[str, Capacity] = field(default_factory=dict)  # by broker
    latency_rate_per_s: float = math.nan
    bus_ms: list[float] = field(default_factory=list, repr=False)  # send() returned → arrival
    base_ms: list[float] = field(default_factory=list, repr=False)  # POST sent → arrival
    # send() returned → arrival at the same load with the MongoDB server stopped (optional)
    mongo_stopped_ms: list[float] = field(default_factory=list, repr=False)
    # (seconds since the phase began, latency ms) for the plot
    bus_series: list[tuple[float, float]] = field(default_factory=list, repr=False)
    base_series: list[tuple[float, float]] = field(default_factory=list, repr=False)
    # (seconds since the phase began, receiver accepted → push began ms), from the bus records
    inside_series: list[tuple[float, float]] = field(default_factory=list, repr=False)
    # the bus's p50 split at the receiver's acceptance and the push's start (bus records), ms
    stages_p50_ms: dict[str, float] = field(default_factory=dict)
    alone_per_s: float = math.nan
    with_neighbours_per_s: float = math.nan
    alone_steady_per_s: float = math.nan  # over the middle 80% of arrivals
    with_neighbours_steady_per_s: float = math.nan
    # CPU ms per message of A of each process in the isolation phases, by phase
    isolation_cpu: dict[str, dict[str, float]] = field(default_factory=dict)
    neighbour_pushes_per_s: dict[str, float] = field(default_factory=dict)  # B, C, D meanwhile
    problems: list[str] = field(default_factory=list)

    isolation_ratio = ratio_of("with_neighbours_per_s", "alone_per_s")
    isolation_ratio_steady = ratio_of("with_neighbours_steady_per_s", "alone_steady_per_s")

    def figures(self) -> dict[str, float]:
        bus_p50, base_p50 = nearest_rank(self.bus_ms, 0.50), nearest_rank(self.base_ms, 0.50)
        figures: dict[str, float] = {}
        for broker, cap in self.capacity.items():
            figures[f"{broker}_send_per_s"] = cap.send_per_s
            figures[f"{broker}_accepted_per_s"] = cap.accepted_per_s
            figures[f"{broker}_delivered_per_s"] = cap.delivered_per_s
            figures[f"{broker}_recorded_per_s"] = cap.recorded_per_s
            figures[f"{broker}_saturated_p50_ms"] = nearest_rank(cap.latencies_ms, 0.50)
        figures |= {
            "latency_rate_per_s": self.latency_rate_per_s,
            "bus_p50_ms": bus_p50,
            "bus_p95_ms": nearest_rank(self.bus_ms, 0.95),
            "bus_p99_ms": nearest_rank(self.bus_ms, 0.99),
            "direct_p50_ms": base_p50,
            "direct_p95_ms": nearest_rank(self.base_ms, 0.95),
            "direct_p99_ms": nearest_rank(self.base_ms, 0.99),
            "overhead_p50_ms": bus_p50 - base_p50,
            **(self._mongo_stopped(bus_p50 - base_p50, base_p50) if self.mongo_stopped_ms
               else {}),
            **{f"stage_{name}_p50_ms": ms for name, ms in self.stages_p50_ms.items()},
            "alone_per_s": self.alone_per_s,
            "with_neighbours_per_s": self.with_neighbours_per_s,
            "isolation_ratio": self.isolation_ratio,
            "isolation_ratio_steady": self.isolation_ratio_steady,
        }
        return figures

    def _mongo_stopped(self, overhead_ms: float, base_p50: float) -> dict[str, float]:
        stopped_ms = nearest_rank(self.mongo_stopped_ms, 0.50) - base_p50
        return {"overhead_mongo_stopped_p50_ms": stopped_ms,
                "mongo_stopped_overhead_ratio": stopped_ms / max(overhead_ms, 1e-9)}

    def lines(self) -> list[str]:
        f = self.figures()
        lines = [f"run {self.run}  {broker}: send() {cap.send_per_s:,.0f}/s, accepted "
                 f"{cap.accepted_per_s:,.0f}/s, delivered {cap.delivered_per_s:,.0f}/s, "
                 f"recorded {cap.recorded_per_s:,.0f}/s ({cap.messages} messages); CPU cores: "
                 + ", ".join(f"{role} {c:.2f}" for role, c in cap.cpu_cores.items())
                 for broker, cap in self.capacity.items()]
        lines.append(
            f"run {self.run}  latency at {self.latency_rate_per_s:,.0f} msg/s: send() → "
            f"subscriber p50/p95/p99 {f['bus_p50_ms']:.1f}/{f['bus_p95_ms']:.1f}/"
            f"{f['bus_p99_ms']:.1f} ms; direct POST {f['direct_p50_ms']:.1f}/"
            f"{f['direct_p95_ms']:.1f}/{f['direct_p99_ms']:.1f} ms; overhead p50 "
            f"{f['overhead_p50_ms']:.1f} ms; p50 of its stages: "
            + ", ".join(f"{name} {ms:.1f} ms" for name, ms in self.stages_p50_ms.items()))
        if self.mongo_stopped_ms:
            lines.append(f"run {self.run}  latency with MongoDB stopped: overhead p50 "
                         f"{f['overhead_mongo_stopped_p50_ms']:.1f} ms, "
                         f"{f['mongo_stopped_overhead_ratio']:.2f}x the overhead with it running")
        lines.append(f"run {self.run}  isolation: A alone {self.alone_per_s:,.0f}/s, with "
                     f"broken and slow neighbours {self.with_neighbours_per_s:,.0f}/s, ratio "
                     f"{self.isolation_ratio:.3f} (meanwhile pushes/s: "
                     + ", ".join(f"{k} {v:,.1f}" for k, v in self.neighbour_pushes_per_s.items())
                     + f"); middle 80% of arrivals: {self.alone_steady_per_s:,.0f}/s and "
                     f"{self.with_neighbours_steady_per_s:,.0f}/s, ratio "
                     f"{self.isolation_ratio_steady:.3f}")
        lines += [f"run {self.run}  isolation, A {phase}: CPU ms per message of A: "
                  + ", ".join(f"{role} {ms:.2f}" for role, ms in cores.items())
                  for phase, cores in self.isolation_cpu.items()]
        return lines + [f"run {self.run}  PROBLEM: {p}" for p in self.problems]


def summarize(runs: list[E2ERun]) -> dict[str, dict[str, float]]:
    figures = [r.figures() for r in runs]  # each sorts the run's latency lists: once per run
    names = list(figures[0]) if figures else []
    return {name: spread([f.get(name, math.nan) for f in figures]) for name in names}


def cpu_summary(runs: list[E2ERun]) -> dict[str, dict[str, dict[str, float]]]:
    """CPU cores per process during each broker's saturation phase, min/median/max."""
    brokers = list(runs[0].capacity) if runs else []
    return {broker: {role: spread([r.capacity[broker].cpu_cores.get(role, math.nan)
                                   for r in runs])
                     for role in runs[0].capacity[broker].cpu_cores}
            for broker in brokers}


def goals(summary: dict[str, dict[str, float]]) -> dict[str, dict[str, Any]]:
    def goal(name: str, target: float, at_least: bool) -> dict[str, Any]:
        value = summary.get(name, {}).get("median", math.nan)
        met = value >= target if at_least else value <= target
        return {"goal": target, "median": value, "met": bool(met)}

    found = {"e2e_msgs_per_s": goal("kafka_delivered_per_s", GOAL_MSGS_PER_S, True),
             "overhead_p50_ms": goal("overhead_p50_ms", GOAL_OVERHEAD_P50_MS, False),
             "isolation_ratio": goal("isolation_ratio", GOAL_ISOLATION_RATIO, True)}
    if "mongo_stopped_overhead_ratio" in summary:
        found["mongo_stopped_overhead_ratio"] = goal(
            "mongo_stopped_overhead_ratio", GOAL_MONGO_STOPPED_RATIO, False)
    return found


def table(summary: dict[str, dict[str, float]],
          cpu: dict[str, dict[str, dict[str, float]]]) -> list[str]:
    head = f"{'figure':<44} {'min / median / max':>30}"
    lines = [head, "-" * len(head)]
    for name, s in summary.items():
        fmt = ".3f" if "ratio" in name else ".1f" if name.endswith("_ms") else ",.0f"
        lines.append(f"{name:<44} {cell(s, fmt):>30}")
    for broker, roles in cpu.items():
        lines.append(f"\nCPU cores while saturated through {broker} (min / median / max):")
        lines += [f"  {role:<42} {cell(s, '.2f'):>30}" for role, s in roles.items()]
    lines.append("")
    for name, g in goals(summary).items():
        sign = "≤" if name in AT_MOST else "≥"
        lines.append(f"goal {name} {sign} {g['goal']:g}: median {g['median']:.3g} -> "
                     f"{'met' if g['met'] else 'MISSED'}")
    return lines


def plot(runs: list[E2ERun], path: Path) -> Path | None:
    """Latency over time of each run's half-load phase: bus, its receiver → push part, and
    direct POST; None without matplotlib (the `analytics` extra brings it)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 3 * len(runs)), squeeze=False)
    for ax, run in zip(axes[:, 0], runs, strict=True):
        for series, label, colour in ((run.bus_series, "send() → subscriber (bus)", "tab:blue"),
                                      (run.inside_series, "of which receiver → push",
                                       "tab:green"),
                                      (run.base_series, "direct POST", "tab:orange")):
            if series:
                xs, ys = zip(*series, strict=True)
                ax.scatter(xs, ys, s=2, alpha=0.5, label=label, color=colour)
        ax.set_title(f"run {run.run}: latency at {run.latency_rate_per_s:,.0f} msg/s")
        ax.set_xlabel("seconds into the phase")
        ax.set_ylabel("ms")
        ax.set_yscale("log")
        ax.legend(loc="upper right", markerscale=5)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
