"""Figures of `python -m bench.dispatch`: one `RunFigures` per run, min/median/max over runs,
the table and the final JSON object (its floats `bench.report.rounded`). A phase that did not
run (`--only-auth`) leaves its figures nan: its lines, table rows and goals are left out."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.dispatch_subscriber import PACED_S
from bench.report import cell, percentile_of, ratio_of, spread

GOAL_RATIO_VS_RAW = 0.70
GOAL_REPLICAS_RATIO = 0.90
GOAL_OAUTH2_RATIO = 0.90

# figure -> (table label, format)
FIGURES: dict[str, tuple[str, str]] = {
    "raw_pushes_per_s": ("raw aiohttp push loop, pushes/s", ",.0f"),
    "dispatcher_pushes_per_s": ("dispatcher (1 process), pushes/s", ",.0f"),
    "ratio_vs_raw_push": ("dispatcher ÷ raw loop", ".3f"),
    "raw_cpu_ms_per_1k": ("raw loop CPU ms per 1000 pushes", ",.0f"),
    "dispatcher_cpu_ms_per_1k": ("dispatcher CPU ms per 1000 pushes", ",.0f"),
    "dispatcher_cpu_busy": ("dispatcher CPU while pushing, cores", ".2f"),
    "raw_stack_cpu_ms_per_1k": ("raw phase, all processes, CPU ms/1k", ",.0f"),
    "stack_cpu_ms_per_1k": ("dispatch phase, all processes, CPU ms/1k", ",.0f"),
    "subscriber_cpu_ms_per_1k": ("  of which the subscriber", ",.0f"),
    "tansu_cpu_ms_per_1k": ("  of which tansu", ",.0f"),
    "mongo_cpu_ms_per_1k": ("  of which SecantusDB (trace writes)", ",.0f"),
    "cpu_ratio": ("raw ÷ dispatch CPU per push (all procs)", ".3f"),
    "alone_pushes_per_s": ("A alone, pushes/s", ",.0f"),
    "with_neighbours_pushes_per_s": ("A with B, C, D, pushes/s", ",.0f"),
    "isolation_ratio": ("isolation ratio (with ÷ alone)", ".3f"),
    "isolation_ratio_steady": ("  over the middle 80% of arrivals", ".3f"),
    "neighbour_c_per_s": ("  C (500s) pushes/s meanwhile", ",.0f"),
    "neighbour_d_per_s": ("  D (300 ms) pushes/s meanwhile", ",.1f"),
    "neighbour_b_per_s": ("  B (timeouts) pushes/s meanwhile", ",.1f"),
    "replicas_one_per_s": ("1 dispatcher, one cap, 20 ms subscriber, /s", ",.0f"),
    "replicas_three_per_s": ("3 dispatchers sharing the cap, /s", ",.0f"),
    "replicas_ratio": ("3 ÷ min(1 * 3, cap ÷ 20 ms)", ".3f"),
    "replicas_free_per_s": ("3 dispatchers, a cap that does not bind, /s", ",.0f"),
    "replicas_machine_ratio": ("3 sharing ÷ min(3 not bound, cap ÷ 20 ms)", ".3f"),
    "peak_concurrency": ("  most pushes at once (≤ the cap)", ",.0f"),
    "latency_offered_per_s": ("latency load offered, msg/s", ",.0f"),
    "latency_achieved_per_s": ("latency load accepted, msg/s", ",.0f"),
    "p50_ms": ("accepted → subscriber p50 ms", ".1f"),
    "p99_ms": ("accepted → subscriber p99 ms", ".1f"),
    "max_ms": ("accepted → subscriber max ms", ".1f"),
    "answer_p50_ms": ("send → 202 p50 ms", ".1f"),
    "answer_p99_ms": ("send → 202 p99 ms", ".1f"),
    "auth_plain_per_s": ("auth: plain http, pushes/s", ",.0f"),
    "auth_oauth2_per_s": ("auth: OAuth2 (same http subscriber), /s", ",.0f"),
    "auth_https_per_s": ("auth: https (server TLS only), /s", ",.0f"),
    "auth_mtls_per_s": ("auth: mutual TLS, /s", ",.0f"),
    "auth_oauth2_ratio": ("OAuth2 ÷ plain", ".3f"),
    "auth_https_ratio": ("https ÷ plain", ".3f"),
    "auth_mtls_ratio": ("mTLS ÷ plain", ".3f"),
    "auth_mtls_vs_https": ("mTLS ÷ https (the client certificate)", ".3f"),
    "auth_token_fetches": ("  token fetches in the OAuth2 phase", ".0f"),
    "auth_plain_cpu_ms_per_1k": ("  dispatcher CPU ms/1k pushing, plain", ",.0f"),
    "auth_oauth2_cpu_ms_per_1k": ("  dispatcher CPU ms/1k pushing, OAuth2", ",.0f"),
    "auth_https_cpu_ms_per_1k": ("  dispatcher CPU ms/1k pushing, https", ",.0f"),
    "auth_mtls_cpu_ms_per_1k": ("  dispatcher CPU ms/1k pushing, mTLS", ",.0f"),
}


@dataclass
class RunFigures:
    run: int
    raw_pushes_per_s: float = math.nan
    dispatcher_pushes_per_s: float = math.nan
    raw_cpu_ms_per_1k: float = math.nan
    dispatcher_cpu_ms_per_1k: float = math.nan
    dispatcher_cpu_busy: float = math.nan
    alone_pushes_per_s: float = math.nan
    with_neighbours_pushes_per_s: float = math.nan
    # the same over the middle 80% of arrivals (steady_rate_of)
    alone_steady_per_s: float = math.nan
    with_neighbours_steady_per_s: float = math.nan
    neighbour_b_per_s: float = math.nan
    neighbour_c_per_s: float = math.nan
    neighbour_d_per_s: float = math.nan
    latency_offered_per_s: float = math.nan
    latency_achieved_per_s: float = math.nan
    replicas_one_per_s: float = math.nan
    replicas_three_per_s: float = math.nan
    replicas_free_per_s: float = math.nan  # three dispatchers, a cap 3x as large
    replicas_peak: int = 0
    replicas_cap: int = 0
    raw_stack_cpu_ms_per_1k: float = math.nan
    # the auth phase (issue 40): pushes/s and dispatcher CPU ms per 1000 pushes of each kind of
    # subscription, and the tokens the OAuth2 server issued during the OAuth2 one
    auth_plain_per_s: float = math.nan
    auth_oauth2_per_s: float = math.nan
    auth_https_per_s: float = math.nan
    auth_mtls_per_s: float = math.nan
    auth_plain_cpu_ms_per_1k: float = math.nan
    auth_oauth2_cpu_ms_per_1k: float = math.nan
    auth_https_cpu_ms_per_1k: float = math.nan
    auth_mtls_cpu_ms_per_1k: float = math.nan
    auth_token_fetches: float = math.nan
    # CPU ms per 1000 pushes of each process of the stack in the capacity phase, by role
    stack_cpu_ms_by_role: dict[str, float] = field(default_factory=dict)
    latencies_ms: list[float] = field(default_factory=list, repr=False)
    answer_ms: list[float] = field(default_factory=list, repr=False)
    problems: list[str] = field(default_factory=list)

    ratio_vs_raw_push = ratio_of("dispatcher_pushes_per_s", "raw_pushes_per_s")

    @property
    def stack_cpu_ms_per_1k(self) -> float:
        return sum(self.stack_cpu_ms_by_role.values()) if self.stack_cpu_ms_by_role else math.nan

    @property
    def subscriber_cpu_ms_per_1k(self) -> float:
        return self.stack_cpu_ms_by_role.get("subscriber", math.nan)

    @property
    def tansu_cpu_ms_per_1k(self) -> float:
        return self.stack_cpu_ms_by_role.get("tansu", math.nan)

    @property
    def mongo_cpu_ms_per_1k(self) -> float:
        return self.stack_cpu_ms_by_role.get("mongo", math.nan)

    # what the push ratio would be if both phases were bound by the same CPU: the whole
    # machine's CPU per push of the raw phase ÷ that of the dispatch phase
    cpu_ratio = ratio_of("raw_stack_cpu_ms_per_1k", "stack_cpu_ms_per_1k")
    isolation_ratio = ratio_of("with_neighbours_pushes_per_s", "alone_pushes_per_s")
    isolation_ratio_steady = ratio_of("with_neighbours_steady_per_s", "alone_steady_per_s")
    auth_oauth2_ratio = ratio_of("auth_oauth2_per_s", "auth_plain_per_s")
    auth_https_ratio = ratio_of("auth_https_per_s", "auth_plain_per_s")
    auth_mtls_ratio = ratio_of("auth_mtls_per_s", "auth_plain_per_s")
    auth_mtls_vs_https = ratio_of("auth_mtls_per_s", "auth_https_per_s")

    @property
    def replicas_ratio(self) -> float:
        """Three dispatchers sharing one cap ÷ what they could do: three times one, or the
        cap's own limit (cap ÷ the subscriber's answer time), whichever is lower."""
        possible = min(self.replicas_one_per_s * 3, self.replicas_cap / PACED_S)
        return self.replicas_three_per_s / possible if possible else math.nan

    @property
    def replicas_machine_ratio(self) -> float:
        """Three dispatchers sharing one cap ÷ what three dispatchers push on this machine when
        the cap does not bind (or the cap's own limit, if lower): the cost of sharing alone."""
        possible = min(self.replicas_free_per_s, self.replicas_cap / PACED_S)
        return self.replicas_three_per_s / possible if possible else math.nan

    @property
    def peak_concurrency(self) -> float:
        return float(self.replicas_peak) if self.replicas_cap else math.nan  # nan: not run

    p50_ms = percentile_of("latencies_ms", 0.50)
    p99_ms = percentile_of("latencies_ms", 0.99)
    answer_p50_ms = percentile_of("answer_ms", 0.50)
    answer_p99_ms = percentile_of("answer_ms", 0.99)

    @property
    def max_ms(self) -> float:
        return max(self.latencies_ms, default=math.nan)

    def figure(self, name: str) -> float:
        return float(getattr(self, name))

    def lines(self) -> list[str]:
        r = self
        phases = [
            f"run {r.run}  push: raw loop {r.raw_pushes_per_s:,.0f}/s, dispatcher "
            f"{r.dispatcher_pushes_per_s:,.0f}/s, ratio {r.ratio_vs_raw_push:.3f}; CPU ms per "
            f"1000 pushes raw {r.raw_cpu_ms_per_1k:,.0f}, dispatcher "
            f"{r.dispatcher_cpu_ms_per_1k:,.0f} (dispatcher busy {r.dispatcher_cpu_busy:.2f} "
            "cores while pushing)",
            f"run {r.run}  CPU ms per 1000 pushes, every process: raw phase "
            f"{r.raw_stack_cpu_ms_per_1k:,.0f}, dispatch phase {r.stack_cpu_ms_per_1k:,.0f} ("
            + ", ".join(f"{role} {ms:,.0f}" for role, ms in r.stack_cpu_ms_by_role.items())
            + f"); ratio {r.cpu_ratio:.3f}",
            f"run {r.run}  isolation: A alone {r.alone_pushes_per_s:,.0f}/s, with neighbours "
            f"{r.with_neighbours_pushes_per_s:,.0f}/s, ratio {r.isolation_ratio:.3f} "
            f"(meanwhile B {r.neighbour_b_per_s:,.1f}/s, C {r.neighbour_c_per_s:,.0f}/s, "
            f"D {r.neighbour_d_per_s:,.1f}/s); middle 80% of arrivals: ratio "
            f"{r.isolation_ratio_steady:.3f}",
            f"run {r.run}  replicas (cap {r.replicas_cap}): one dispatcher "
            f"{r.replicas_one_per_s:,.0f}/s, three {r.replicas_three_per_s:,.0f}/s, ratio "
            f"{r.replicas_ratio:.3f}; three with a cap that does not bind "
            f"{r.replicas_free_per_s:,.0f}/s, ratio to that {r.replicas_machine_ratio:.3f}; "
            f"most pushes at once {r.replicas_peak}",
            f"run {r.run}  latency at {r.latency_offered_per_s:,.0f} msg/s offered "
            f"({r.latency_achieved_per_s:,.0f} accepted), {len(r.latencies_ms)} messages: "
            f"accepted → subscriber p50 {r.p50_ms:.1f} ms, p99 {r.p99_ms:.1f} ms, max "
            f"{r.max_ms:.1f} ms; send → 202 p50 {r.answer_p50_ms:.1f} ms, p99 "
            f"{r.answer_p99_ms:.1f} ms",
            f"run {r.run}  auth: plain {r.auth_plain_per_s:,.0f}/s, OAuth2 "
            f"{r.auth_oauth2_per_s:,.0f}/s ({r.auth_token_fetches:.0f} token fetches), https "
            f"{r.auth_https_per_s:,.0f}/s, mTLS {r.auth_mtls_per_s:,.0f}/s; OAuth2 ÷ plain "
            f"{r.auth_oauth2_ratio:.3f}, mTLS ÷ plain {r.auth_mtls_ratio:.3f}, mTLS ÷ https "
            f"{r.auth_mtls_vs_https:.3f}; dispatcher CPU ms per 1000 pushes while pushing: plain "
            f"{r.auth_plain_cpu_ms_per_1k:,.0f}, OAuth2 {r.auth_oauth2_cpu_ms_per_1k:,.0f}, "
            f"https {r.auth_https_cpu_ms_per_1k:,.0f}, mTLS {r.auth_mtls_cpu_ms_per_1k:,.0f}",
        ]
        # each phase's line, if the phase ran (its first figure is not nan)
        ran = [r.raw_pushes_per_s, r.raw_stack_cpu_ms_per_1k, r.alone_pushes_per_s,
               r.replicas_one_per_s, r.latency_offered_per_s, r.auth_plain_per_s]
        lines = [line for line, figure in zip(phases, ran, strict=True)
                 if not math.isnan(figure)]
        return lines + [f"run {r.run}  PROBLEM: {p}" for p in r.problems]


def summarize(runs: list[RunFigures]) -> dict[str, dict[str, float]]:
    return {name: spread([r.figure(name) for r in runs]) for name in FIGURES}


# figure -> (goal, what it says): each a median ratio that should reach the goal
GOALS: dict[str, tuple[float, str]] = {
    "ratio_vs_raw_push": (GOAL_RATIO_VS_RAW, "dispatcher ≥ {goal:.0%} of the raw loop"),
    "replicas_ratio": (GOAL_REPLICAS_RATIO,
                       "3 dispatchers ≥ {goal:.0%} of min(1 * 3, cap ÷ 20 ms)"),
    "auth_oauth2_ratio": (GOAL_OAUTH2_RATIO, "OAuth2 pushes ≥ {goal:.0%} of plain ones"),
}


def measured(summary: dict[str, dict[str, float]], name: str) -> bool:
    return not math.isnan(summary[name]["median"])


def table(summary: dict[str, dict[str, float]]) -> list[str]:
    head = f"{'figure':<40} {'min / median / max':>32}"
    lines = [head, "-" * len(head)]
    for name, (label, fmt) in FIGURES.items():
        if measured(summary, name):  # else its phase did not run
            lines.append(f"{label:<40} {cell(summary[name], fmt):>32}")
    lines.append("")
    for name, (goal, says) in GOALS.items():
        if measured(summary, name):
            ratio = summary[name]["median"]
            verdict = "met" if ratio >= goal else "MISSED"
            lines.append(f"goal: {says.format(goal=goal)} (median): {ratio:.1%} -> {verdict}")
    return lines


def json_figures(summary: dict[str, dict[str, float]], runs: list[RunFigures],
                 config: dict[str, Any]) -> dict[str, Any]:
    medians = {name: s["median"] for name, s in summary.items()}
    ratio = medians["ratio_vs_raw_push"]
    return {
        "bench": "dispatch",
        "ratio_vs_raw_push": ratio,
        "isolation_ratio": medians["isolation_ratio"],
        "p50_ms": medians["p50_ms"],
        "p99_ms": medians["p99_ms"],
        "dispatcher_pushes_per_s": medians["dispatcher_pushes_per_s"],
        "raw_pushes_per_s": medians["raw_pushes_per_s"],
        "cpu_ratio": medians["cpu_ratio"],
        "replicas_ratio": medians["replicas_ratio"],
        "replicas_machine_ratio": medians["replicas_machine_ratio"],
        "peak_concurrency": max((r.replicas_peak for r in runs), default=0),
        "auth_oauth2_ratio": medians["auth_oauth2_ratio"],
        "auth_mtls_ratio": medians["auth_mtls_ratio"],
        "auth_mtls_vs_https": medians["auth_mtls_vs_https"],
        "goals": {name: {"goal": goal, "met": bool(medians[name] >= goal)}
                  for name, (goal, _) in GOALS.items() if measured(summary, name)},
        "spread": summary,
        "runs": [{k: v for k, v in asdict(r).items() if k not in ("latencies_ms", "answer_ms")}
                 | {name: r.figure(name) for name in FIGURES} for r in runs],
        "config": config,
        "problems": [f"run {r.run}: {p}" for r in runs for p in r.problems],
    }
